// Bad-input table, part 5: jobs of two ranks under mpiexec. A partition that cannot be made or
// does not cover the blocks, a bad input found by rank 0 while validating, and one found by the
// last rank while it loads its own slice. Every rank must end with the same exit code and the
// message must be printed once, by the rank that found the fault.

#include <filesystem>

#include "core/error.h"
#include "harness.h"
#include "safetensors_edit.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::vector<BadInput> rows() {
  return {
      BadInput("mpi_more_ranks_than_blocks", kExitUsage, "UsageError",
               {"cannot split the transformer's 1 blocks over 2 ranks: every rank needs at least one block"})
          .setup([](Workspace& w) {
            fs::remove_all(w.model());
            copy_tree(one_block_model(), w.model());
          })
          .ranks(2),
      BadInput("mpi_partition_not_covering", kExitUsage, "UsageError", {"--partition: blocks 2 are given to no rank"})
          .args({"--partition", "0:0-1,1:3-4"})
          .ranks(2),
      BadInput("mpi_partition_overlapping", kExitUsage, "UsageError", {"--partition: blocks 1 are given to both rank 0 and rank 1"})
          .args({"--partition", "0:0-1,1:1-4"})
          .ranks(2),
      BadInput("mpi_partition_rank_without_blocks", kExitUsage, "UsageError", {"--partition: rank 1 has no blocks"})
          .args({"--partition", "0:0-4"})
          .ranks(2),
      BadInput("mpi_bad_config_found_by_rank_0", kExitBadInput, "ConfigError",
               {"model dir '{model}': transformer/config.json: not valid JSON"})
          .setup([](Workspace& w) { write_bytes(w.model_file("transformer/config.json"), "{\"num_layers\": "); })
          .ranks(2),
      // Validation reads only the weights' headers the configs are checked against; a tensor of
      // the last block is looked for by the last rank alone, when it loads its slice.
      BadInput("mpi_tensor_missing_on_last_rank", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: tensor '{key}' not found"})
          .setup([](Workspace& w) {
            const std::string dir = w.model_file("transformer");
            const json config = read_json(w.model_file("transformer/config.json"));
            const int64_t last = config["num_single_layers"].get<int64_t>() - 1;
            const std::string key = "single_transformer_blocks." + std::to_string(last) + ".proj_out.weight";
            w.define("key", key);
            const std::string shard = dir + "/" + shard_of(dir, key);
            SafetensorsBytes st = SafetensorsBytes::read(shard);
            st.remove(key);
            st.write(shard);
            edit_json(index_of(dir), [&](json& j) { j["weight_map"].erase(key); });
          })
          .ranks(2, /*reporter=*/1),
  };
}

class MpiJobs : public testing::TestWithParam<BadInput> {};

TEST_P(MpiJobs, FailsCleanlyOnEveryRank) { GetParam().check(); }

INSTANTIATE_TEST_SUITE_P(BadInputs, MpiJobs, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
