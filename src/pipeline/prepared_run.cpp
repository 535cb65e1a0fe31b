#include "pipeline/prepared_run.h"

namespace fluxmpi::pipeline {

bool PreparedRun::any_encoding() const {
  for (const auto& p : progress)
    if (!p.decoded && p.needs_encoding) return true;
  return false;
}

}  // namespace fluxmpi::pipeline
