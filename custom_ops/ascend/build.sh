#!/usr/bin/env bash
# Builds the installable CANN custom-op package (custom_opp_<os>_<arch>.run) for KlDivCustom, KlDivCustomGrad,
# DistillCustom, DistillCustomGrad, SparseDistillCustom and SparseDistillCustomGrad, vendor "ms_kldiv".
#
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh        # CANN >= 8.0 (toolkit), see docs/ascend.md
#   bash custom_ops/ascend/build.sh [--soc ascend910b] [--build-dir DIR] [--install [--install-path DIR]]
#
# The CMake plumbing of a CANN operator project (cmake/*.cmake, scripts/, the packaging of the .run file)
# belongs to the toolkit: msopgen generates it from kl_div_custom.json + distill_custom.json +
# sparse_distill_custom.json, and this script puts our op_host/ and op_kernel/ sources in place of the generated
# stubs and runs the project's own build.
# Nothing is written into the source tree; the default build directory is ./build_ascend_opp.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOC="ascend910b"
BUILD_DIR="$(pwd)/build_ascend_opp"
INSTALL=0
INSTALL_PATH=""
VENDOR="ms_kldiv"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --soc) SOC="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --install) INSTALL=1; shift ;;
    --install-path) INSTALL_PATH="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

if [[ -z "${ASCEND_HOME_PATH:-}" ]] || ! command -v msopgen >/dev/null 2>&1; then
  echo "error: CANN toolkit not found (ASCEND_HOME_PATH unset or msopgen not on PATH)." >&2
  echo "       source <CANN>/ascend-toolkit/set_env.sh first; see docs/ascend.md." >&2
  exit 3
fi

# msopgen names the compute unit ai_core-<soc>, e.g. ai_core-ascend910b.
PROJECT="${BUILD_DIR}/KlDivCustom"
rm -rf "${PROJECT}"
mkdir -p "${BUILD_DIR}"
# One project for all six operators: msopgen takes one description, so the three are concatenated.
python3 - "${HERE}/kl_div_custom.json" "${HERE}/distill_custom.json" "${HERE}/sparse_distill_custom.json" \
  "${BUILD_DIR}/ms_kldiv_ops.json" <<'PY'
import json, sys
ops = []
for path in sys.argv[1:-1]:
    with open(path) as f:
        ops += json.load(f)
with open(sys.argv[-1], "w") as f:
    json.dump(ops, f, indent=2)
PY
msopgen gen -i "${BUILD_DIR}/ms_kldiv_ops.json" -c "ai_core-${SOC}" -lan cpp -out "${PROJECT}"

# Our sources replace the generated stubs (same file names msopgen derives from the op names).
rm -f "${PROJECT}"/op_host/*.cpp "${PROJECT}"/op_host/*.h "${PROJECT}"/op_kernel/*.cpp "${PROJECT}"/op_kernel/*.h
cp "${HERE}"/op_host/*.cpp "${HERE}"/op_host/*.h "${PROJECT}/op_host/"
cp "${HERE}"/op_kernel/*.cpp "${HERE}"/op_kernel/*.h "${PROJECT}/op_kernel/"
# The host tilings include ../op_kernel/*_tiling_plan.h, which the copy above keeps valid.

# Vendor name and CANN path in the generated CMakePresets.json.
python3 - "${PROJECT}/CMakePresets.json" "${VENDOR}" "${ASCEND_HOME_PATH}" <<'PY'
import json, sys
path, vendor, cann = sys.argv[1:4]
with open(path) as f:
    presets = json.load(f)
for preset in presets.get("configurePresets", []):
    cache = preset.setdefault("cacheVariables", {})
    for key, value in (("vendor_name", vendor), ("ASCEND_CANN_PACKAGE_PATH", cann)):
        if key in cache:
            if isinstance(cache[key], dict):
                cache[key]["value"] = value
            else:
                cache[key] = value
with open(path, "w") as f:
    json.dump(presets, f, indent=4)
PY

(cd "${PROJECT}" && bash build.sh)
RUN_FILE="$(ls "${PROJECT}"/build_out/custom_opp_*.run | head -n 1)"
echo "package: ${RUN_FILE}"

if [[ ${INSTALL} -eq 1 ]]; then
  if [[ -n "${INSTALL_PATH}" ]]; then
    bash "${RUN_FILE}" --install-path="${INSTALL_PATH}"
    echo "installed under ${INSTALL_PATH}/vendors/${VENDOR}; export ASCEND_CUSTOM_OPP_PATH=${INSTALL_PATH}/vendors/${VENDOR}:\${ASCEND_CUSTOM_OPP_PATH:-}"
  else
    bash "${RUN_FILE}"
    echo "installed under \${ASCEND_OPP_PATH}/vendors/${VENDOR}"
  fi
fi
