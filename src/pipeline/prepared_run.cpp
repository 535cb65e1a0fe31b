#include "pipeline/prepared_run.h"

#include "core/error.h"

namespace fluxmpi::pipeline {

bool PreparedRun::any_encoding() const {
  for (const auto& p : progress)
    if (!p.decoded && p.needs_encoding) return true;
  return false;
}

void check_patch_rows(const RunConfig& c, const flux::LatentGeometry& g) {
  // Patches are runs of whole rows of image tokens.
  const int64_t token_rows = g.latent_height / 2;
  if (c.patches > token_rows)
    throw UsageError(str_cat("--patches ", c.patches, " exceeds the ", token_rows, " rows of image tokens of a ", g.width,
                             "x", g.height, " image (a patch is at least one row)"));
}

}  // namespace fluxmpi::pipeline
