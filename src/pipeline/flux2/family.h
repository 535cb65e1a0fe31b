#pragma once
// The FLUX.2 family (Flux2Pipeline, Flux2KleinPipeline) behind pipeline/family.h: its rank-0 side
// is in pipeline/flux2/root.cpp, its stages in pipeline/flux2/stages.h. Internal to the family; the
// flow finds it through family_of / family_named.

#include <memory>

#include "io/flux2_configs.h"
#include "pipeline/family.h"

namespace fluxmpi::pipeline {

const Family& flux2_family();
/// World rank 0's side of one FLUX.2 run.
std::unique_ptr<FamilyRoot> flux2_root();
/// "FLUX.2 [dev]", "FLUX.2 [klein]", "FLUX.2 [klein] base": the model in messages.
const char* flux2_model_name(io::Flux2Kind kind);

}  // namespace fluxmpi::pipeline
