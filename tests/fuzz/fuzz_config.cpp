// libFuzzer target: io::ConfigReader and the typed config parsers. The first byte picks the
// config kind ('t' transformer, 's' scheduler, 'v' VAE, 'c' CLIP text, '5' T5, 'n' ControlNet, and
// FLUX.1 Redux's 'g' SigLIP vision, 'p' SigLIP processor, 'r' Redux embedder; other bytes by value),
// the rest is the config.json text.
// Contract: a parser returns a config or throws ConfigError; a config it returns survives the
// round trip through to_json() unchanged (the Redux configs have no to_json: they only parse).
// Anything else is a bug.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/configs.h"
#include "io/controlnet_config.h"
#include "io/redux_dir.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// Parses `text` as a config; when it is accepted, what to_json() writes must be accepted too and
// give the same config (compared through its JSON form, the only equality the configs define).
// Only the first parse may reject its input: an exception from the second escapes as a bug.
template <typename Parse>
void round_trip(const std::string& text, Parse parse) {
  std::string written;
  try {
    written = fluxmpi::io::to_json(parse(fluxmpi::io::ConfigReader::from_text(text, "fuzz/config.json")));
  } catch (const fluxmpi::ConfigError&) {
    return;  // the documented rejection
  }
  const auto again = parse(fluxmpi::io::ConfigReader::from_text(written, "fuzz/written.json"));
  require(fluxmpi::io::to_json(again) == written);
}

template <typename Parse>
void parse_only(const std::string& text, Parse parse) {
  try {
    parse(fluxmpi::io::ConfigReader::from_text(text, "fuzz/config.json"));
  } catch (const fluxmpi::ConfigError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint8_t k = data[0];
  if (k == 'g' || k == 'p' || k == 'r') {
    if (k == 'g') parse_only(text, fluxmpi::io::parse_siglip_vision_config);
    if (k == 'p') parse_only(text, fluxmpi::io::parse_siglip_processor_config);
    if (k == 'r') parse_only(text, fluxmpi::io::parse_redux_embedder_config);
    return 0;
  }
  switch (k == 't' ? 0 : k == 's' ? 1 : k == 'v' ? 2 : k == 'c' ? 3 : k == '5' ? 4 : k == 'n' ? 5 : k % 5) {
    case 0: round_trip(text, fluxmpi::io::parse_transformer_config); break;
    case 1: round_trip(text, fluxmpi::io::parse_scheduler_config); break;
    case 2: round_trip(text, fluxmpi::io::parse_vae_config); break;
    case 3: round_trip(text, fluxmpi::io::parse_clip_text_config); break;
    case 5: round_trip(text, fluxmpi::io::parse_controlnet_config); break;
    default: round_trip(text, fluxmpi::io::parse_t5_config); break;
  }
  return 0;
}
