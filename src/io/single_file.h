#pragma once
/// Single safetensors files in the layouts community checkpoints use, presented as the diffusers
/// keys fluxmpi's modules are named by. The mapping is made on the tensor index (names, row
/// ranges, shapes), never by building a renamed copy: a rank reads only the bytes of its blocks.
///
/// Layouts (key maps as diffusers' single-file converters, v0.40):
///   transformer  original Black Forest Labs keys (flux1-dev.safetensors; FLUX.2's
///                io/flux2_original_keys.h), bare or under `model.diffusion_model.` (ComfyUI); or
///                diffusers keys, bare. In a safetensors or a GGUF file (io/gguf.h).
///   vae          LDM keys (ae.safetensors: `decoder.up.K`, `decoder.mid.attn_1`), bare or under
///                `vae.` / `first_stage_model.`; or diffusers keys, bare
///   text_encoder    transformers CLIPTextModel keys (`text_model.*`), bare or under
///                   `text_encoders.clip_l.transformer.`
///   text_encoder_2  transformers T5EncoderModel keys (`encoder.*`, `shared.weight`), bare or
///                   under `text_encoders.t5xxl.transformer.`
/// A file may hold several components (ComfyUI "all-in-one" checkpoints hold all four).

#include <memory>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/flux2_configs.h"
#include "io/safetensors.h"
#include "io/tensor_store.h"

namespace fluxmpi::io {

enum class Component { Transformer, Vae, TextEncoder, TextEncoder2 };
/// The diffusers folder name: "transformer", "vae", "text_encoder", "text_encoder_2".
const char* component_name(Component c);
/// The command-line option that names it: "--transformer", "--vae", ...
const char* component_option(Component c);
inline constexpr Component kComponents[] = {Component::Transformer, Component::Vae, Component::TextEncoder,
                                            Component::TextEncoder2};

enum class KeyLayout {
  Diffusers,     ///< the keys fluxmpi's modules use (diffusers / transformers)
  OriginalFlux,  ///< Black Forest Labs transformer keys
  Ldm,           ///< LDM / original VAE keys
};

/// One component found in a file: its key prefix (may be empty) and layout.
struct ComponentInFile {
  Component component = Component::Transformer;
  std::string prefix;
  KeyLayout layout = KeyLayout::Diffusers;
};

/// "original FLUX keys under 'model.diffusion_model.'", "LDM keys", "transformers keys under '...'".
std::string describe_layout(const ComponentInFile& c);

/// The components a file's header shows, by their key families, in kComponents order.
std::vector<ComponentInFile> detect_components(const SafetensorsHeader& header);

/// The configs a mapping needs: widths of the original transformer layout (FLUX.1's, or FLUX.2's
/// when `flux2` is set), levels of the LDM VAE.
struct LayoutConfigs {
  const TransformerConfig* transformer = nullptr;
  const Flux2TransformerConfig* flux2 = nullptr;
  const VaeConfig* vae = nullptr;
  std::string transformer_label;  ///< names the transformer config in errors ("model dir '/m': transformer/config.json")
  std::string vae_label;
};

/// Opens `found` inside the single file `path` as a store presenting the diffusers keys. Every
/// key of the component (under its prefix) is accounted for here, from the header alone: a key
/// the layout does not know, blocks that skip a number or exceed the config's counts, rows that
/// do not fit the config's widths are WeightErrors naming the file and the key. Keys of the
/// component that fluxmpi never loads (the VAE encoder) are presented under their own names, for
/// the loader to skip. `label` prefixes every error.
TensorStore open_component(std::shared_ptr<const WeightFile> file, const ComponentInFile& found,
                           const LayoutConfigs& configs, const std::string& label);

/// Whether a transformer in this file has a guidance embedder (FLUX.1-dev) or not (schnell):
/// `guidance_in.*` in the original layout, `time_text_embed.guidance_embedder.*` in diffusers'.
bool has_guidance_embedder(const SafetensorsHeader& header, const ComponentInFile& transformer);

/// The shape of every diffusers transformer tensor a complete model of `config` has.
std::vector<std::pair<std::string, std::vector<int64_t>>> flux_diffusers_shapes(const TransformerConfig& config);

/// Compares, from the headers alone, every tensor of a transformer store with the shape `config`
/// gives it: a missing tensor or another shape is a WeightError naming the tensor (and where it is
/// stored), the expected and the actual shape. Tensors beyond the config are reported too.
void check_transformer_shapes(const TensorStore& store, const TransformerConfig& config);

}  // namespace fluxmpi::io
