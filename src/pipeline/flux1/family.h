#pragma once
// The FLUX.1 family (FluxPipeline and its image-input variants) behind pipeline/family.h: its
// rank-0 side is in pipeline/flux1/root.cpp. Internal to the family; the flow finds it through
// family_of / family_named.

#include <memory>

#include "pipeline/family.h"

namespace fluxmpi::pipeline {

const Family& flux1_family();
/// World rank 0's side of one FLUX.1 run.
std::unique_ptr<FamilyRoot> flux1_root();

}  // namespace fluxmpi::pipeline
