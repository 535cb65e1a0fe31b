#pragma once
// Hollow FLUX.2 pipeline folders at real size (as hollow_model.h does for FLUX.1): the shipped
// configs of share/fluxmpi/models/FLUX.2-* (built from FLUX2-SOURCES.md), weight headers with the
// real names and shapes over file holes, and the tiny fixture tokenizer of the same kind (the real
// vocabularies are not available; only validation reads a tokenizer in a dry run). The text
// encoder file holds what a real checkpoint holds beside the language model: the lm_head and, for
// dev, vision-tower and projector tensors, which no reader may touch.

#include <string>

#include "support/hollow_model.h"

namespace fluxmpi::test {

/// `model` is a folder name under share/fluxmpi/models ("FLUX.2-dev", "FLUX.2-klein-4B", ...).
/// Writes the pipeline folder `dir` (created; must not exist).
HollowModel write_hollow_flux2_model(const std::string& model, const std::string& dir);

}  // namespace fluxmpi::test
