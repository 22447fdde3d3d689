// The DistillCustom / DistillCustomGrad tiling fields that follow from the operators' attributes (temperature,
// beta, divergence, alpha, softcap, logit_scale), computed once in double and rounded once to float32. Shared by the
// host tiling function (distill_custom.cpp) and the CPU stand-in's driver (tests/ascend/ascendc_sim), so both fill
// the same numbers. No CANN dependency.
#ifndef DISTILL_HYPER_H_
#define DISTILL_HYPER_H_

#include <cmath>
#include <cstdint>

#include "../op_kernel/distill_tiling_plan.h"

namespace distill_hyper {

struct Attrs {
  double temperature, beta;
  int64_t divergence;  // ms_kldiv/_distill_math.py DIVERGENCES: 0 'kl', 1 'tvd', 2 'skew_kl', 3 'skew_rkl', 4 'symmetric_kl'
  double alpha, softcap, logitScale;
};

// The kind (distill_tiling::Kind), or a value > kSymmetric when the attributes are out of range: temperature > 0
// and finite, beta and alpha in [0, 1] (alpha < 1 for the skew divergences), softcap >= 0 and finite (0: none),
// logit_scale > 0 and finite.
inline uint32_t Validate(const Attrs& a) {
  const uint32_t bad = distill_tiling::kSymmetric + 1;
  if (!(a.temperature > 0.0) || !std::isfinite(a.temperature) || !(a.beta >= 0.0 && a.beta <= 1.0)) return bad;
  if (a.divergence < 0 || a.divergence >= static_cast<int64_t>(distill_tiling::kDivergences)) return bad;
  if (!(a.alpha >= 0.0 && a.alpha <= 1.0) || !(a.softcap >= 0.0) || !std::isfinite(a.softcap)) return bad;
  if (!(a.logitScale > 0.0) || !std::isfinite(a.logitScale)) return bad;
  const uint32_t kind = distill_tiling::KindOf(static_cast<float>(a.beta), static_cast<uint32_t>(a.divergence));
  if ((kind == distill_tiling::kSkewKl || kind == distill_tiling::kSkewRkl) && !(a.alpha < 1.0)) return bad;
  return kind;
}

// Sets kind, softcap, the temperature's fields, beta, alpha, the log-mixture's weights and the transform's scales.
template <typename TilingData>
void Fill(const Attrs& a, uint32_t kind, TilingData* td) {
  const double t = a.temperature;
  td->set_kind(kind);
  td->set_softcap(a.softcap > 0.0 ? 1U : 0U);
  td->set_invTemperature(static_cast<float>(1.0 / t));
  td->set_temperature(static_cast<float>(t));
  td->set_tSquared(static_cast<float>(t * t));
  td->set_beta(static_cast<float>(a.beta));
  td->set_alpha(static_cast<float>(a.alpha));
  // The log-mixture M = w_t P_t + w_s P_s of the JSD and the skew divergences (distill::mix_of).
  double wt = 0.0;
  const bool mixes = kind == distill_tiling::kJSD || kind == distill_tiling::kSkewKl || kind == distill_tiling::kSkewRkl;
  if (kind == distill_tiling::kJSD) wt = a.beta;
  if (kind == distill_tiling::kSkewKl) wt = a.alpha;
  if (kind == distill_tiling::kSkewRkl) wt = 1.0 - a.alpha;
  td->set_logBeta(mixes ? static_cast<float>(wt > 0.0 ? std::log(wt) : -INFINITY) : 0.0f);
  td->set_log1mBeta(mixes ? static_cast<float>(wt < 1.0 ? std::log1p(-wt) : -INFINITY) : 0.0f);
  if (a.softcap > 0.0) {
    td->set_preScale(static_cast<float>(a.logitScale / a.softcap));
    td->set_postScale(static_cast<float>(a.softcap / t));
  } else {
    td->set_preScale(static_cast<float>(a.logitScale / t));
    td->set_postScale(1.0f);
  }
  td->set_gradScale(static_cast<float>(a.logitScale));
}

}  // namespace distill_hyper

#endif  // DISTILL_HYPER_H_
