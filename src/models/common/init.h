#pragma once
/// Random weights and saving modules as safetensors: make-tiny-model writes whole pipelines this
/// way, and tests build models without any file.

#include <torch/nn/module.h>

#include <cstdint>
#include <string>

#include "io/safetensors_writer.h"

namespace fluxmpi::nn {

/// Fills every parameter deterministically from `seed` (float32, CPU): matrices and kernels
/// N(0, gain / sqrt(fan_in)), biases N(0, 0.05), 1-D scales 1 + N(0, 0.1).
void fill_random(torch::nn::Module& module, uint64_t seed, double gain = 1.0);

/// Adds every parameter of `module` as `prefix + name`, converted to `dtype` (F32, BF16 or F16).
void add_parameters(io::SafetensorsWriter& writer, const torch::nn::Module& module, const std::string& prefix,
                    io::DType dtype);

/// Writes `module` as a diffusers / transformers component folder: `config.json` (the given
/// text) and the weights, in one `<stem>.safetensors` (num_shards = 1) or in `num_shards` files
/// `<stem>-0000k-of-0000n.safetensors` of about equal size plus `<stem>.safetensors.index.json`.
void save_component(const std::string& dir, const std::string& config_json, const torch::nn::Module& module,
                    const std::string& stem, io::DType dtype, int num_shards = 1);

/// Casts all parameters to `dtype` (tests that run models without loading a file).
void cast_parameters(torch::nn::Module& module, at::ScalarType dtype);

}  // namespace fluxmpi::nn
