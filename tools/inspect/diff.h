#pragma once
// fluxmpi-inspect --diff: numeric comparison of two checkpoints, dataset by dataset.

#include <cstdint>
#include <optional>
#include <ostream>

#include "ckpt/checkpoint_reader.h"

namespace fluxmpi::inspect {

// Compares every numeric dataset of `file` with the same dataset of `reference` (committed rows
// only) and the image status; prints one line per dataset with max |diff| and the relative
// difference max |diff| / max(1, max |reference|). Attributes are not compared. Returns true when
// every relative difference is <= tol and the number of images, shapes and statuses agree.
bool diff_checkpoints(const ckpt::CheckpointReader& file, const ckpt::CheckpointReader& reference,
                      std::optional<int64_t> image, double tol, std::ostream& out);

}  // namespace fluxmpi::inspect
