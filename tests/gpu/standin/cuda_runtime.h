// Stand-in for the CUDA header of this name (see cuda_sim.h).
#pragma once
#include "cuda_sim.h"
