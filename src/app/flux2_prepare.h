#pragma once
/// Rank 0's validation of a FLUX.2 run (Flux2Pipeline, Flux2KleinPipeline): the same contract as
/// prepare_run — every mistake is one error before anything heavy — for the second model family.
/// What differs from FLUX.1 (docs/flux2.md): one decoder-only text encoder whose hidden states of
/// --text-encoder-layers are stacked; --guidance is diffusers' guidance_scale (dev: the guidance
/// embedder; klein: ignored; klein base: true CFG with the empty negative prompt when > 1); the
/// defaults of each model; no image inputs, LoRAs or single files (yet).

#include "app/prepare.h"

namespace fluxmpi::app {

/// The FLUX.2 defaults diffusers' examples and BFL recommend.
struct Flux2Defaults {
  int64_t steps;
  double guidance;
};
Flux2Defaults flux2_defaults(io::Flux2Kind kind);

/// Whether a FLUX.2 run takes two transformer passes per step (klein base with guidance > 1).
bool flux2_true_cfg(io::Flux2Kind kind, double guidance);

/// Continues prepare_run for a FLUX.2 model: `run` has its options (the checkpoint's filled in)
/// and its ModelDir; `checkpoint` is the resumed file or null.
Preparation prepare_flux2_run(PreparedRun run, const ckpt::CheckpointReader* checkpoint, int world_size);

}  // namespace fluxmpi::app
