// Bad-input table, part 2: weight files. Every malformation the safetensors header parser
// rejects, shards listed in the index but missing, tensors listed twice or in two shards, dtypes
// fluxmpi cannot load, tensors missing, unexpected or of the wrong shape, and broken weights of
// the components that run before (text encoders) and after (VAE) the transformer.

#include <algorithm>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "harness.h"
#include "safetensors_edit.h"

namespace fluxmpi::reliability {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Setup = std::function<void(Workspace&)>;

// The tensors the rows break: a projection of the first double block, and its 1-D q-norm weight
// (float32 [head_dim], so that a 4-byte integer dtype fits its bytes exactly).
const std::string kKey = "transformer_blocks.0.attn.to_q.weight";
const std::string kNormKey = "transformer_blocks.0.attn.norm_q.weight";

// Defines {shard} (absolute path), {shard_name} and {index} (file name) for the culprit texts and
// returns the path of the shard that holds `key`.
std::string locate(Workspace& w, const std::string& key) {
  const std::string dir = w.model_file("transformer");
  const std::string name = shard_of(dir, key);
  w.define("shard", dir + "/" + name);
  w.define("shard_name", name);
  w.define("index", fs::path(index_of(dir)).filename().string());
  return dir + "/" + name;
}

// Rewrites the shard holding kKey from its parts, changed by `edit`.
Setup edit_shard(std::function<void(SafetensorsBytes&)> edit) {
  return [=](Workspace& w) {
    const std::string path = locate(w, kKey);
    SafetensorsBytes st = SafetensorsBytes::read(path);
    edit(st);
    st.write(path);
  };
}

// Rewrites the shard holding kKey with its header text changed by `edit` (may break the JSON).
Setup edit_header_text(std::function<std::string(const SafetensorsBytes&, const std::string&)> edit) {
  return [=](Workspace& w) {
    const std::string path = locate(w, kKey);
    const SafetensorsBytes st = SafetensorsBytes::read(path);
    SafetensorsBytes::write_raw(path, edit(st, st.header.dump()), st.data);
  };
}

// Replaces the shard holding kKey by `make(its bytes)`.
Setup rewrite_shard(std::function<std::string(const std::string&)> make) {
  return [=](Workspace& w) {
    const std::string path = locate(w, kKey);
    write_bytes(path, make(read_bytes(path)));
  };
}

std::string with_length_field(std::string bytes, uint64_t n) {
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

Setup edit_index(std::function<void(json&)> edit) {
  return [=](Workspace& w) {
    locate(w, kKey);
    edit_json(index_of(w.model_file("transformer")), edit);
  };
}

// The two tensors at the start of the data section, in offset order.
std::pair<std::string, std::string> first_two(const SafetensorsBytes& st) {
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (const auto& n : st.names()) by_offset.push_back({st.header[n]["data_offsets"][0].get<uint64_t>(), n});
  std::sort(by_offset.begin(), by_offset.end());
  return {by_offset.at(0).second, by_offset.at(1).second};
}

std::vector<BadInput> rows() {
  return {
      // --- Malformed safetensors files (the torch-free header parser) ---------------------------
      BadInput("safetensors_shorter_than_length_field", kExitBadInput, "WeightError",
               {"'{shard}': not a safetensors file: 5 bytes, shorter than the 8-byte header length"})
          .setup(rewrite_shard([](const std::string& b) { return b.substr(0, 5); })),
      BadInput("safetensors_header_beyond_file", kExitBadInput, "WeightError",
               {"'{shard}': header length ", "runs beyond the end of the file"})
          .setup(rewrite_shard([](const std::string& b) { return with_length_field(b, b.size() + 10); })),
      BadInput("safetensors_header_above_limit", kExitBadInput, "WeightError",
               {"'{shard}': header length 200000000 exceeds the limit of 100000000 bytes"})
          .setup(rewrite_shard([](const std::string& b) { return with_length_field(b, 200000000); })),
      BadInput("safetensors_header_not_json", kExitBadInput, "WeightError", {"'{shard}': header is not valid JSON"})
          .setup(edit_header_text([](const SafetensorsBytes&, const std::string& t) { return t.substr(0, t.size() / 2); })),
      BadInput("safetensors_header_not_object", kExitBadInput, "WeightError", {"'{shard}': header is not a JSON object"})
          .setup(rewrite_shard([](const std::string&) { return SafetensorsBytes::serialize("[1, 2]", ""); })),
      BadInput("safetensors_tensor_listed_twice", kExitBadInput, "WeightError",
               {"'{shard}': tensor '" + kKey + "' is listed twice in the header"})
          .setup(edit_header_text([](const SafetensorsBytes& st, const std::string& t) {
            return "{" + json(kKey).dump() + ":" + st.header[kKey].dump() + "," + t.substr(1);
          })),
      BadInput("safetensors_unknown_dtype", kExitBadInput, "WeightError", {"'{shard}': tensor '" + kKey + "': unknown dtype 'F12'"})
          .setup(edit_shard([](SafetensorsBytes& st) { st.header[kKey]["dtype"] = "F12"; })),
      BadInput("safetensors_shape_disagrees_with_offsets", kExitBadInput, "WeightError",
               {"'{shard}': tensor '" + kKey + "': shape and dtype need"})
          .setup(edit_shard([](SafetensorsBytes& st) { st.header[kKey]["shape"][0] = st.header[kKey]["shape"][0].get<int64_t>() + 1; })),
      BadInput("safetensors_negative_dimension", kExitBadInput, "WeightError",
               {"'{shard}': tensor '" + kKey + "': shape entry -1 is not a non-negative integer"})
          .setup(edit_shard([](SafetensorsBytes& st) { st.header[kKey]["shape"][0] = -1; })),
      BadInput("safetensors_offsets_reversed", kExitBadInput, "WeightError", {"'{shard}': tensor '" + kKey + "': data_offsets [", "end before they begin"})
          .setup(edit_shard([](SafetensorsBytes& st) {
            auto& off = st.header[kKey]["data_offsets"];
            off = {off[1], off[0]};
          })),
      BadInput("safetensors_data_truncated", kExitBadInput, "WeightError", {"'{shard}': tensor '", "run beyond the data section"})
          .setup(rewrite_shard([](const std::string& b) { return b.substr(0, b.size() - 4); })),
      BadInput("safetensors_tensors_overlap", kExitBadInput, "WeightError", {"'{shard}': tensor '", "data overlaps the previous tensor"})
          .setup(edit_shard([](SafetensorsBytes& st) {
            auto [a, b] = first_two(st);
            const uint64_t size = st.header[b]["data_offsets"][1].get<uint64_t>() - st.header[b]["data_offsets"][0].get<uint64_t>();
            st.header[b]["data_offsets"] = {0, size};  // b now starts where a does
          })),
      BadInput("safetensors_trailing_bytes", kExitBadInput, "WeightError", {"'{shard}': tensors cover ", "bytes of a data section of "})
          .setup(edit_shard([](SafetensorsBytes& st) { st.data += std::string(16, '\0'); })),
      BadInput("safetensors_metadata_not_string", kExitBadInput, "WeightError", {"'{shard}': __metadata__ value 'format' is not a string"})
          .setup(edit_shard([](SafetensorsBytes& st) { st.header["__metadata__"] = {{"format", 1}}; })),
      BadInput("safetensors_unsupported_dtype", kExitBadInput, "WeightError",
               {"'{shard}': tensor '" + kNormKey + "' has dtype U32, which fluxmpi cannot load"})
          .setup([](Workspace& w) {
            const std::string path = locate(w, kNormKey);
            SafetensorsBytes st = SafetensorsBytes::read(path);
            st.header[kNormKey]["dtype"] = "U32";  // same element size as F32: only the dtype is wrong
            st.write(path);
          }),

      // --- Sharded weights and their index ------------------------------------------------------
      BadInput("shard_missing", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer/{index}: shard '{shard_name}' listed in the index is missing"})
          .setup([](Workspace& w) { fs::remove(locate(w, kKey)); }),
      BadInput("index_not_json", kExitBadInput, "WeightError", {"model dir '{model}': transformer/{index}: not valid JSON"})
          .setup([](Workspace& w) {
            locate(w, kKey);
            const std::string index = index_of(w.model_file("transformer"));
            truncate_file(index, read_bytes(index).size() / 2);
          }),
      BadInput("index_without_weight_map", kExitBadInput, "WeightError", {"transformer/{index}: missing object 'weight_map'"})
          .setup(edit_index([](json& j) { j.erase("weight_map"); })),
      BadInput("index_names_file_outside_folder", kExitBadInput, "WeightError",
               {"transformer/{index}: weight_map['" + kKey + "'] = '../vae/diffusion_pytorch_model.safetensors' is not a file name inside the directory"})
          .setup(edit_index([](json& j) { j["weight_map"][kKey] = "../vae/diffusion_pytorch_model.safetensors"; })),
      BadInput("tensor_in_index_missing_from_shard", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: tensor '" + kKey + "' is listed in the index but missing from '{shard}'"})
          .setup(edit_shard([](SafetensorsBytes& st) { st.remove(kKey); })),
      BadInput("tensor_stored_in_two_shards", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: tensor '" + kKey + "' is stored in '", "' but the index assigns it to '{shard_name}'"})
          .setup([](Workspace& w) {
            const std::string home = locate(w, kKey);
            const std::string dir = w.model_file("transformer");
            const json index = read_json(index_of(dir));
            std::string other;
            for (const auto& [key, file] : index["weight_map"].items())
              if (file.get<std::string>() != fs::path(home).filename().string()) other = dir + "/" + file.get<std::string>();
            ASSERT_FALSE(other.empty()) << "the transformer has a single shard";
            const SafetensorsBytes src = SafetensorsBytes::read(home);
            SafetensorsBytes dst = SafetensorsBytes::read(other);
            dst.append(kKey, src.header[kKey]["dtype"].get<std::string>(), src.header[kKey]["shape"].get<std::vector<int64_t>>(),
                       src.bytes(kKey));
            dst.write(other);
          }),
      BadInput("tensor_missing", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: tensor '" + kKey + "' not found (expected shape ["})
          .setup([](Workspace& w) {
            edit_shard([](SafetensorsBytes& st) { st.remove(kKey); })(w);
            edit_json(index_of(w.model_file("transformer")), [](json& j) { j["weight_map"].erase(kKey); });
          }),
      BadInput("tensor_unexpected", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: unexpected tensor 'transformer_blocks.0.attn.to_z.weight' in '{shard_name}': no parameter of the model claims it"})
          .setup([](Workspace& w) {
            // A copy of to_q under a name no module has, in the same shard and in the index.
            const std::string extra = "transformer_blocks.0.attn.to_z.weight";
            edit_shard([&](SafetensorsBytes& st) {
              st.append(extra, st.header[kKey]["dtype"].get<std::string>(), st.header[kKey]["shape"].get<std::vector<int64_t>>(),
                        st.bytes(kKey));
            })(w);
            const std::string shard = w.expand("{shard_name}");
            edit_json(index_of(w.model_file("transformer")), [&](json& j) { j["weight_map"][extra] = shard; });
          }),
      BadInput("tensor_wrong_shape", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: tensor '" + kKey + "' in '{shard_name}' has shape [", "], expected ["})
          .setup(edit_shard([](SafetensorsBytes& st) {
            const auto shape = st.header[kKey]["shape"].get<std::vector<int64_t>>();
            const std::string bytes = st.bytes(kKey);
            st.remove(kKey);
            st.append(kKey, "F32", {shape[1], shape[0] * 2}, bytes + bytes);  // [D, D] -> [D, 2D]
          })),
      BadInput("transformer_weights_missing", kExitBadInput, "WeightError",
               {"model dir '{model}': transformer: no safetensors weights in '{model}/transformer'"})
          .setup([](Workspace& w) {
            for (const auto& e : fs::directory_iterator(w.model_file("transformer")))
              if (e.path().filename() != "config.json") fs::remove(e.path());
          }),

      // --- The other components -----------------------------------------------------------------
      BadInput("t5_weights_missing_tensor", kExitBadInput, "WeightError",
               {"model dir '{model}': text_encoder_2: tensor 'encoder.final_layer_norm.weight' not found"})
          .setup([](Workspace& w) {
            const std::string path = w.model_file("text_encoder_2/model.safetensors");
            SafetensorsBytes st = SafetensorsBytes::read(path);
            st.remove("encoder.final_layer_norm.weight");
            st.write(path);
          }),
      // The VAE decodes after the denoising loop; a broken VAE file is found at validation, like
      // the transformer's, before any heavy work and any checkpoint.
      BadInput("vae_weights_truncated", kExitBadInput, "WeightError",
               {"'{model}/vae/diffusion_pytorch_model.safetensors': tensor '", "run beyond the data section"})
          .setup([](Workspace& w) {
            const std::string path = w.model_file("vae/diffusion_pytorch_model.safetensors");
            truncate_file(path, read_bytes(path).size() / 2);
          })
          .args({"--checkpoint", "{work}/out/run.h5"}),
  };
}

class WeightFiles : public testing::TestWithParam<BadInput> {};

TEST_P(WeightFiles, FailsCleanly) { GetParam().check(); }

INSTANTIATE_TEST_SUITE_P(BadInputs, WeightFiles, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
