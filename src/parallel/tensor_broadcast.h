#pragma once
/// Tensors from one member of a communicator to all of them, in one collective: the pipeline
/// leaders receive from world rank 0 what it prepared for the job (`--stages`). Undefined tensors
/// travel as such; dtypes: floating, integer and bool.

#include <ATen/ATen.h>

#include <vector>

#include "parallel/communicator.h"

namespace fluxmpi::parallel {

/// On `root`, sends `tensors` (contiguous CPU copies are made as needed); elsewhere replaces
/// `tensors` with the root's, contiguous on the CPU. Collective over `comm`.
void broadcast_tensors(const Communicator& comm, std::vector<at::Tensor>& tensors, int root = 0);

}  // namespace fluxmpi::parallel
