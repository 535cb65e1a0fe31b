// Precompiled header of the libtorch-using targets: the libtorch headers take ~10 s per file.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <string>
#include <vector>
