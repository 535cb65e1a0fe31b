#include "app/option_table.h"

#include "core/error.h"

namespace fluxmpi::app::options {
namespace po = boost::program_options;

namespace {

const std::vector<Spec> kSpecs = {
    {"model", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr,
     "diffusers FluxPipeline folder (FLUX.1-dev or FLUX.1-schnell), or one .safetensors file: a transformer "
     "(original or diffusers keys) or an all-in-one checkpoint; with --resume, default: the one the checkpoint names", false},
    {"transformer", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr,
     "transformer weights replacing --model's: a diffusers component folder or a single file", false},
    {"gguf", 0, Group::Model, Kind::Text, "FILE", nullptr,
     "a quantized GGUF transformer (city96-style, original FLUX keys; kept quantized, dequantized per layer): "
     "--transformer FILE for a .gguf file; the text encoders and the VAE come from --model or their options", false},
    {"vae", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr, "VAE weights (diffusers folder, or ae.safetensors-style file)", false},
    {"text-encoder", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr, "CLIP text encoder weights (folder or clip_l.safetensors)", false},
    {"text-encoder-2", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr, "T5 encoder weights (folder or t5xxl_*.safetensors)", false},
    {"model-config", 0, Group::Model, Kind::Text, "DIR", nullptr,
     "diffusers-layout folder whose configs, tokenizers and scheduler describe the weights (its weights are not "
     "read); default: --model when a folder, else the shipped FLUX.1-dev or FLUX.1-schnell configs", false},
    {"dtype", 0, Group::Model, Kind::Text, "auto|fp32|bf16|fp16", "auto",
     "compute dtype; auto: bf16 on cuda and on CPUs with native bf16 (avx512_bf16, amx_bf16), else fp32; "
     "weights of any dtype are converted", false},
    {"lora", 0, Group::Model, Kind::Text, "FILE[:SCALE]", nullptr,
     "merge a LoRA (diffusers/PEFT or kohya safetensors) into the weights, scaled (default 1); repeatable, "
     "stacked in the order given", false, /*repeatable=*/true},

    {"prompt", 0, Group::Sampling, Kind::Text, "TEXT", nullptr, "the prompt (CLIP, and T5 unless --prompt-2)", false},
    {"prompts-file", 0, Group::Sampling, Kind::Text, "FILE", nullptr,
     "UTF-8 file with one prompt per line (blank lines skipped); instead of --prompt", false},
    {"prompt-2", 0, Group::Sampling, Kind::Text, "TEXT", nullptr, "prompt of the T5 encoder for every image (default: the prompt)", false},
    {"negative-prompt", 0, Group::Sampling, Kind::Text, "TEXT", nullptr,
     "negative prompt of every image; used with --true-cfg > 1", false},
    {"true-cfg", 0, Group::Sampling, Kind::Number, "SCALE", "1",
     "true classifier-free guidance scale (> 1 with --negative-prompt: two transformer passes per step)", false},
    {"num-images", 0, Group::Sampling, Kind::Integer, "N", "1", "images per prompt", false},
    {"seed", 0, Group::Sampling, Kind::Integer, "S", nullptr, "image i of the job uses seed S + i (default: random, printed)", false},
    {"height", 0, Group::Sampling, Kind::Integer, "PIXELS", nullptr,
     "image height (default 1024), floored to a multiple of 2 x VAE scale factor (16)", false},
    {"width", 0, Group::Sampling, Kind::Integer, "PIXELS", nullptr, "image width (default 1024), floored likewise", false},
    {"steps", 0, Group::Sampling, Kind::Integer, "N", nullptr,
     "denoising steps (default: 28 for dev, 4 for schnell; FLUX.2: 4 klein, 50 klein base and dev)", false},
    {"guidance", 0, Group::Sampling, Kind::Number, "SCALE", nullptr,
     "guidance scale of dev (default 3.5); schnell has no guidance and ignores it; FLUX.2: diffusers' guidance_scale "
     "(default 4; klein ignores it, klein base runs true CFG when > 1)", false},
    {"max-sequence-length", 0, Group::Sampling, Kind::Integer, "N", nullptr,
     "T5 tokens, 1..512 (default: 512 for dev, 256 for schnell; FLUX.2: text-encoder tokens, default 512)", false},
    {"text-encoder-layers", 0, Group::Sampling, Kind::Text, "A,B,C", nullptr,
     "FLUX.2: the text encoder's hidden states stacked into the prompt embedding (diffusers' "
     "text_encoder_out_layers; default 10,20,30 for dev, 9,18,27 for klein)", false},

    // Image inputs (docs/images.md): the mode follows from the model and the images given.
    {"image", 0, Group::Images, Kind::Text, "FILE", nullptr,
     "PNG/JPEG/WebP input: img2img on a FLUX.1 model, inpainting with --mask, Fill (FluxFillPipeline) with --mask, "
     "the image to edit on a Kontext model; on a FLUX.2 model a reference image (repeatable: multi-reference "
     "editing, in order)", false, /*repeatable=*/true},
    {"mask", 0, Group::Images, Kind::Text, "FILE", nullptr, "inpainting mask, white = repaint (resized to the image, binarised at 50 %)", false},
    {"control-image", 0, Group::Images, Kind::Text, "FILE", nullptr,
     "the edge or depth map of a FLUX.1 Canny/Depth model (FluxControlPipeline); with --controlnet the control image "
     "of each ControlNet, or of each condition of one Union ControlNet (repeatable, in order)", false, /*repeatable=*/true},
    {"controlnet", 0, Group::Images, Kind::Text, "DIR", nullptr,
     "a FLUX ControlNet folder (FluxControlNetModel: InstantX, Union or XLabs layout) beside a FLUX.1 model "
     "(FluxControlNetPipeline); repeatable: several ControlNets, one --control-image each", false, /*repeatable=*/true},
    {"control-mode", 0, Group::Images, Kind::Integer, "N", nullptr,
     "the control mode of a Union ControlNet's control image, 0 <= N < num_mode (-1 for a ControlNet without modes); "
     "once per --control-image", false, /*repeatable=*/true},
    {"controlnet-scale", 0, Group::Images, Kind::Number, "S", nullptr,
     "ControlNet conditioning scale (default 1): once for every control image, or once per --control-image", false,
     /*repeatable=*/true},
    {"control-guidance-start", 0, Group::Images, Kind::Number, "A", nullptr,
     "fraction of the steps before which a ControlNet does not act (default 0): once, or once per --control-image",
     false, /*repeatable=*/true},
    {"control-guidance-end", 0, Group::Images, Kind::Number, "B", nullptr,
     "fraction of the steps after which a ControlNet does not act (default 1): once, or once per --control-image", false,
     /*repeatable=*/true},
    {"strength", 0, Group::Images, Kind::Number, "S", nullptr,
     "img2img/inpaint/Fill: how much of the schedule runs, 0 < S <= 1 (default 0.6; Fill 1)", false},
    {"pipeline", 0, Group::Images, Kind::Text, "NAME", nullptr,
     "text2img|img2img|inpaint|fill|control|kontext (or the diffusers class name): when the model folder does not "
     "say, e.g. a Kontext single file", false},
    {"max-area", 0, Group::Images, Kind::Integer, "PIXELS", "1048576",
     "Kontext: the output's pixel count; its aspect is the requested --width/--height's (1024x1024 when not given)", false},
    {"no-auto-resize", 0, Group::Images, Kind::Flag, nullptr, nullptr,
     "Kontext: encode the image at its own size (floored to 16), not at the preferred Kontext resolution", false},
    // FLUX.1 Redux (docs/redux.md): FluxPriorReduxPipeline before the FLUX.1 pipeline.
    {"redux-model", 0, Group::Images, Kind::Text, "DIR", nullptr,
     "FLUX.1 Redux folder (FluxPriorReduxPipeline, e.g. FLUX.1-Redux-dev): its SigLIP encoder and Redux embedder "
     "append each --redux-image's tokens to the text (to zeros when no --prompt is given)", false},
    {"redux-image", 0, Group::Images, Kind::Text, "FILE", nullptr,
     "a reference image of --redux-model; repeatable: the images' embeddings are scaled and summed", false,
     /*repeatable=*/true},
    {"redux-prompt-scale", 0, Group::Images, Kind::Text, "S[,S...]", nullptr,
     "diffusers' prompt_embeds_scale: one scale for every --redux-image or one per image (default 1)", false},
    {"redux-pooled-scale", 0, Group::Images, Kind::Text, "S[,S...]", nullptr,
     "diffusers' pooled_prompt_embeds_scale: one scale for every --redux-image or one per image (default 1)", false},

    {"device", 0, Group::Parallel, Kind::Text, "cpu|cuda", "cpu", "rank r uses cuda:<local rank mod GPUs>, or the CPU", false},
    {"threads", 0, Group::Parallel, Kind::Integer, "N", "0", "CPU threads per rank; 0 = max(1, cores of the node / ranks on it)", false},
    {"balance", 0, Group::Parallel, Kind::Text, "compute|memory", "compute",
     "compute: even block counts (FLOPs); memory: the smallest estimated peak memory per rank (weights, "
     "activations and rank 0's encode/decode stages), then the next largest, ...", false},
    {"partition", 0, Group::Parallel, Kind::Text, "PLAN", nullptr, "explicit blocks per rank, e.g. 0:0-8,1:9-56 (overrides --balance)", false},
    {"max-memory", 0, Group::Parallel, Kind::Text, "BUDGETS", nullptr,
     "memory budget of every rank (16GiB, 16G) or per rank (0=16GiB,1=24GiB)", false},
    {"stages", 0, Group::Parallel, Kind::Integer, "S", nullptr,
     "ranks per pipeline: the P ranks form P/S pipelines of S consecutive ranks, each leader taking the next images "
     "whenever it has room; one checkpoint, written by rank 0 (default: all P ranks, one pipeline)", false},
    {"microbatch", 0, Group::Parallel, Kind::Integer, "N", "1",
     "images per transformer pass (1: bit-identical to one image at a time)", false},
    {"keep-encoders", 0, Group::Parallel, Kind::Flag, nullptr, nullptr, "keep the text encoders loaded on rank 0 after encoding", false},
    // VAE decoding (diffusers enable_tiling / enable_slicing).
    {"vae-tiling", 0, Group::Parallel, Kind::Flag, nullptr, nullptr,
     "decode in overlapping tiles, blended (less memory for large images; on by itself when --max-memory needs it)", false},
    {"vae-slicing", 0, Group::Parallel, Kind::Flag, nullptr, nullptr,
     "decode the images of a microbatch one at a time", false},
    {"patches", 0, Group::Parallel, Kind::Integer, "M", "1",
     "patch pipelining: after the warm-up, each step's image flows through the ranks as M patches of latent rows, "
     "attending to the previous step's keys/values of the patches not yet seen (approximate; 1 = exact)", false},
    {"warmup-steps", 0, Group::Parallel, Kind::Integer, "W", "1",
     "with --patches > 1: the first W steps of each image run exact and fill the key/value buffers", false},

    {"output", 'o', Group::Output, Kind::Text, "PATH", nullptr,
     "PNG file; {i} = image index, 5 digits (default: fluxmpi.png, or fluxmpi-{i}.png for several images)", false},
    {"checkpoint", 0, Group::Output, Kind::Text, "FILE.h5", nullptr, "write every step to this new HDF5 file", false},
    {"checkpoint-every", 0, Group::Output, Kind::Integer, "K", "1", "keep the latents of every K-th step (and of the last)", false},
    {"resume", 0, Group::Output, Kind::Text, "FILE.h5", nullptr,
     "continue the unfinished images of a checkpoint, writing on into it; omitted prompts and sampling options come from it", false},
    {"no-progress", 0, Group::Output, Kind::Flag, nullptr, nullptr, "no progress bar or progress lines", false},

    {"config", 0, Group::General, Kind::Text, "FILE.ini", nullptr, "read options from an INI file (the command line wins)", true},
    {"dry-run", 0, Group::General, Kind::Flag, nullptr, nullptr,
     "print the job and the partition plan and exit; checks every component's weight headers, reads no weights", false},
    {"predict", 0, Group::General, Kind::Text, "PROFILE.json", nullptr,
     "with --dry-run: also print the schedule model's prediction for the job (images/hour, one image's latency, each "
     "rank's idle share) from a tools/sim profile; runs python3", false},
    {"log-level", 0, Group::General, Kind::Text, "LEVEL", "info", "error | warn | info | debug", false},
    {"help", 'h', Group::General, Kind::Flag, nullptr, nullptr, "print this help and exit", true},
    {"version", 0, Group::General, Kind::Flag, nullptr, nullptr, "print the version and exit", true},
};

const char* group_caption(Group g) {
  switch (g) {
    case Group::Model: return "Model";
    case Group::Sampling: return "Sampling";
    case Group::Images: return "Image input";
    case Group::Parallel: return "Parallel";
    case Group::Output: return "Output";
    case Group::General: return "General";
  }
  return "";
}

// The Boost table of one group. On the command line flags take no value; in the INI file every
// key takes one (flags "true"/"false"). Values stay strings: converting them here gives messages
// that name the option and the value, which Boost's lexical casts do not.
po::options_description group_table(Group group, bool for_ini) {
  po::options_description table(str_cat(group_caption(group), " options"), 100, 50);
  for (const Spec& s : kSpecs) {
    if (s.group != group || (for_ini && s.cli_only)) continue;
    std::string names = s.short_name ? str_cat(s.name, ",", s.short_name) : std::string(s.name);
    if (s.kind == Kind::Flag && !for_ini) {
      table.add_options()(names.c_str(), po::bool_switch(), s.help);
      continue;
    }
    auto* value = po::value<std::string>();
    if (s.value_name) value->value_name(s.value_name);
    if (s.fallback) value->default_value(s.fallback);
    table.add_options()(names.c_str(), value, s.help);
  }
  return table;
}

}  // namespace

const std::vector<Spec>& all_specs() { return kSpecs; }

const Spec* find_spec(const std::string& name) {
  for (const Spec& s : kSpecs)
    if (name == s.name) return &s;
  return nullptr;
}

po::options_description full_table(bool for_ini) {
  po::options_description all;
  for (Group g : {Group::Model, Group::Sampling, Group::Images, Group::Parallel, Group::Output, Group::General})
    all.add(group_table(g, for_ini));
  return all;
}

}  // namespace fluxmpi::app::options
