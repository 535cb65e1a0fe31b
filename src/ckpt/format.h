#pragma once
/// The fluxmpi HDF5 checkpoint format (DESIGN.md §5, docs/hdf5-format.md): object names, the
/// attributes a job is described by, the dataset shapes they imply, and the comparison that
/// `--resume` makes between a checkpoint and the command line. Torch- and HDF5-free.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/controlnet_runs.h"
#include "io/configs.h"
#include "io/lora_file.h"

namespace fluxmpi::ckpt {

inline constexpr const char* kFormatName = "fluxmpi";
inline constexpr int64_t kFormatVersion = 1;
/// Tokens of the CLIP prompt (FluxPipeline's tokenizer_max_length).
inline constexpr int64_t kClipTokens = 77;
/// The most reference images a checkpoint's image may record (FLUX.2 models take at most 10).
inline constexpr int64_t kMaxReferenceImages = 64;
/// `status` is a fixed-length, null-padded UTF-8 string of this many bytes: a variable-length
/// string rewritten under SWMR can read back empty in a concurrent reader (docs/hdf5-format.md).
inline constexpr int64_t kStatusBytes = 16;

/// Where an image stands. Stored in `/images/<i>/status` as "encoding" | "denoising" | "decoded".
enum class ImageStatus {
  Encoding,   ///< created; text embeddings not (all) written yet
  Denoising,  ///< text, schedule and initial latents written; rows are appended per step
  Decoded,    ///< the `image` dataset holds the final picture
};
const char* status_name(ImageStatus status);
/// Throws CheckpointError "<where>: status is '<text>', expected encoding, denoising or decoded".
ImageStatus parse_status(const std::string& text, const std::string& where);

/// Attributes of the root group. `format` and `format_version` are implied (kFormatName,
/// kFormatVersion); the reader fills `format_version` from the file.
struct FileAttributes {
  std::string fluxmpi_version;  ///< empty in create(): the running fluxmpi's version
  std::string model;            ///< model directory as given on the command line
  std::string model_config;     ///< text of transformer/config.json
  /// Pixels per latent cell (diffusers' vae_scale_factor, 8 for FLUX.1); with height and width it
  /// fixes L_img. An addition to DESIGN.md §5, documented in docs/hdf5-format.md.
  int64_t vae_scale_factor = 8;
  std::string created;          ///< ISO 8601 UTC; empty in create(): now
  /// Where each component's weights and the configs came from (absolute paths; empty: not
  /// recorded, e.g. a checkpoint of an older fluxmpi). Attributes source_<name>; --resume checks them.
  struct Sources {
    std::string transformer, vae, text_encoder, text_encoder_2, model_config;
    /// A GGUF transformer's tensor types ("F32 x 471, Q8_0 x 304, F16 x 5"; attribute
    /// source_transformer_quantization); empty for any other source.
    std::string transformer_quantization;
  } sources;
  int64_t format_version = kFormatVersion;
};

/// Attributes of `/images/<i>`: everything that determines the image.
struct ImageAttributes {
  std::string prompt;
  std::string prompt_2;
  std::string negative_prompt;
  int64_t seed = 0;                 ///< this image's own seed (S + i)
  int64_t height = 0;               ///< output size after flooring
  int64_t width = 0;
  int64_t num_inference_steps = 0;
  double guidance_scale = 0;
  double true_cfg_scale = 1;
  int64_t max_sequence_length = 0;
  std::string dtype;                ///< run dtype: "fp32" | "bf16" | "fp16"
  /// The LoRAs merged, in order (attribute `loras`: JSON [{"file": ..., "scale": ...}]; absent in
  /// files written before LoRAs existed, which means none).
  std::vector<io::LoraSpec> loras;
  /// 1 when the image is decoded in VAE tiles (--vae-tiling, or switched on for a budget, and
  /// the latent is larger than one tile): tiling changes the pixels. Files without the
  /// attribute read as 0.
  int64_t vae_tiling = 0;
  // Patch pipelining (--patches, --warmup-steps); files without these attributes read as 1, 1.
  int64_t patches = 1;              ///< M; 1: every step exact
  int64_t warmup_steps = 1;         ///< W
  // Image inputs (docs/images.md, docs/hdf5-format.md); files without these attributes are text2img.
  std::string pipeline = "text2img";  ///< pipeline::mode_name: text2img, img2img, inpaint, fill, control, kontext, controlnet
  std::string family = "flux1";
  double strength = 1.0;              ///< img2img, inpaint, Fill (1 for the other modes)
  /// Steps of the full num_inference_steps schedule that the strength skips: the schedule and the
  /// rows hold the remaining num_inference_steps - t_start steps.
  int64_t t_start = 0;
  /// An input file as given (absolute path) and its size as decoded; path empty: not given.
  struct Input {
    std::string path;
    int64_t height = 0, width = 0;
    bool operator==(const Input& o) const { return path == o.path && height == o.height && width == o.width; }
  };
  Input image, mask, control_image;
  /// Kontext: the size the reference image is encoded at (pixels); 0 without one.
  int64_t condition_height = 0, condition_width = 0;
  /// FLUX.1 Redux (docs/redux.md): what FluxPriorReduxPipeline made the text stream from. Stored as
  /// the JSON attribute `redux`; files without it have no Redux.
  struct Redux {
    std::string model;           ///< the --redux-model folder (absolute); empty: no Redux
    std::vector<Input> images;   ///< --redux-image files as given and decoded, in order
    std::vector<double> prompt_scales, pooled_scales;  ///< one per image (prompt_embeds_scale, pooled_...)
    int64_t image_tokens = 0;    ///< tokens the images append to the text (the encoder's patches)
    bool zero_text = false;      ///< no prompt: the prior's zero text (no CLIP/T5 ids are stored)
    bool enabled() const { return !model.empty(); }
  } redux;
  /// ControlNet images: every run (attribute `controlnets`; absent: none).
  std::vector<ControlNetUse> controlnets;
  /// FLUX.2 multi-reference editing (pipeline "multiref"): each reference image as given and
  /// decoded, and the size it is encoded at (pixels), in order. Files without them have none.
  struct Reference {
    Input input;
    int64_t height = 0, width = 0;
  };
  std::vector<Reference> references;
};
/// The `redux` attribute's JSON ({"model", "images": [{"path", "height", "width"}], "prompt_embeds_scale",
/// "pooled_prompt_embeds_scale", "image_tokens", "text": "prompt" | "zeros"}) and back; nullopt when
/// the text is not such an object.
std::string redux_to_json(const ImageAttributes::Redux& redux);
std::optional<ImageAttributes::Redux> redux_from_json(const std::string& text);

/// Whether the image was made with true classifier-free guidance: `true_cfg_scale` stores the
/// effective scale (diffusers runs true CFG when the scale is > 1 and a negative prompt, possibly
/// "", is given; fluxmpi stores 1 when it does not run), so the rule is true_cfg_scale > 1.
/// Exactly then the image has the `text/negative_*` datasets.
bool uses_true_cfg(const ImageAttributes& attributes);

/// Sizes of the datasets of one image group, all implied by the attributes.
struct ImageShape {
  int64_t text_tokens = 0;            ///< S = max_sequence_length (+ the Redux image tokens)
  int64_t prompt_tokens = 0;          ///< the T5 ids' length: max_sequence_length
  bool token_ids = true;              ///< the CLIP/T5 ids are stored (not for Redux's zero text)
  int64_t redux_images = 0;           ///< Redux: images (inputs/redux_image_<k>, text/redux_image_embeds)
  int64_t redux_tokens = 0;           ///< Redux: tokens per image
  std::vector<std::pair<int64_t, int64_t>> redux_hw;  ///< Redux: each image's decoded size
  int64_t joint_attention_dim = 0;
  int64_t pooled_projection_dim = 0;
  int64_t latent_height = 0;          ///< h = height / vae_scale_factor
  int64_t latent_width = 0;
  int64_t latent_channels = 0;        ///< in_channels / 4
  int64_t image_tokens = 0;           ///< L_img = (h/2)(w/2)
  int64_t token_dim = 0;              ///< in_channels (64 for FLUX.1)
  int64_t steps = 0;
  int64_t height = 0;
  int64_t width = 0;
  bool true_cfg = false;
  bool patched = false;               ///< patches > 1: the image has `latents/exact`
  std::string pipeline = "text2img";  ///< ImageAttributes::pipeline
  bool flux2 = false;                 ///< family flux2: text/input_ids and attention_mask, no CLIP/T5/pooled
  int64_t image_h = 0, image_w = 0, mask_h = 0, mask_w = 0, control_h = 0, control_w = 0;  ///< inputs/* (0: none)
  int64_t condition_tokens = 0;       ///< rows of latents/image (0: none)
  int64_t condition_dim = 0;          ///< its features
  /// ControlNet images: each control image's size (inputs/controlnet_image_<k>), and the runs whose
  /// control latents are stored (latents/controlnet [n, L_img, token_dim]; XLabs runs store none).
  std::vector<std::pair<int64_t, int64_t>> controlnet_inputs;
  int64_t controlnet_latents = 0;
  /// FLUX.2 multi-reference: inputs/image_<k> [h, w, 3] of each reference (decoded sizes), and
  /// latents/image_ids [condition_tokens, 4], the references' position ids.
  std::vector<std::pair<int64_t, int64_t>> reference_inputs;
};

/// Element type of a dataset, as stored.
enum class StoredType { Float32, Int32, Int64, UInt8, String };
/// "float32", "int32", "int64", "uint8", "string"
const char* stored_type_name(StoredType type);

/// One dataset of an image group: name relative to the group, type, and shape. Extendable datasets
/// (latents/steps, latents/noise_pred, latents/step_index) have shape[0] = 0 here: their first
/// dimension grows by one row per saved step, in chunks of one row.
struct DatasetSpec {
  std::string name;
  StoredType type;
  std::vector<int64_t> shape;  ///< empty: scalar
  bool extendable = false;
};
/// Every dataset of an image with this shape, in a fixed order (the writer creates them in it, the
/// reader checks them in it).
std::vector<DatasetSpec> dataset_specs(const ImageShape& shape);
/// "float32 [n, 1024, 64]", "int64 scalar"
std::string spec_text(const DatasetSpec& spec);

/// The parsed transformer config stored in `model_config`; throws CheckpointError naming `label`
/// when the text is not a valid FluxTransformer2DModel config.
io::TransformerConfig stored_transformer_config(const std::string& model_config, const std::string& label);
/// Dataset sizes of an image; throws CheckpointError "<where>: ..." when the attributes are not a
/// valid image (size not a multiple of 2 * vae_scale_factor, no steps, ...).
ImageShape image_shape(const io::TransformerConfig& config, const FileAttributes& file,
                       const ImageAttributes& image, const std::string& where);

/// "/images/00003"
std::string image_group(int64_t image);
/// "/images/00003/latents/steps"
std::string image_object(int64_t image, const std::string& relative);

/// Refuses to continue a checkpoint made for another job: compares the format version, the
/// transformer architecture (shape fields of the config), vae_scale_factor, the number of images,
/// then every image attribute in order. Throws CheckpointError naming the first field that
/// differs: "run.h5: /images/00001: 'seed' is 43 in the checkpoint, the command line asks for 44".
void check_matches(const std::string& label, const FileAttributes& stored_file,
                   const std::vector<ImageAttributes>& stored_images, const FileAttributes& requested_file,
                   const std::vector<ImageAttributes>& requested_images);

/// Now as ISO 8601 UTC, e.g. "2026-03-01T12:34:56Z".
std::string iso8601_now();

}  // namespace fluxmpi::ckpt
