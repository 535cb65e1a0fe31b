// fluxmpi-bench-drift: how far an approximate run (patch pipelining) drifts from the exact one.
//   fluxmpi-bench-drift RUN.h5 EXACT.h5 RUN.png EXACT.png [--image I]
// Prints one line: the final latents' relative difference ||x - x_exact|| / ||x_exact|| and
// max |x - x_exact|, and the PSNR of the decoded image against the exact one (8-bit, peak 255).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "io/png.h"

using namespace fluxmpi;

int main(int argc, char** argv) {
  if (argc != 5 && !(argc == 7 && std::string(argv[5]) == "--image")) {
    std::fprintf(stderr, "usage: fluxmpi-bench-drift RUN.h5 EXACT.h5 RUN.png EXACT.png [--image I]\n");
    return 2;
  }
  const int64_t image = argc == 7 ? std::atoll(argv[6]) : 0;
  try {
    const at::Tensor x = ckpt::CheckpointReader::open(argv[1]).latest_latents(image).to(at::kDouble);
    const at::Tensor ref = ckpt::CheckpointReader::open(argv[2]).latest_latents(image).to(at::kDouble);
    FLUX_CHECK(x.sizes() == ref.sizes(), "the two checkpoints hold latents of different shapes");
    const double rel = (x - ref).norm().item<double>() / ref.norm().item<double>();
    const double max_abs = (x - ref).abs().max().item<double>();
    const io::RgbImage a = io::read_png(argv[3]), b = io::read_png(argv[4]);
    FLUX_CHECK(a.width == b.width && a.height == b.height, "the two PNGs differ in size");
    double se = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i) {
      const double d = static_cast<double>(a.pixels[i]) - static_cast<double>(b.pixels[i]);
      se += d * d;
    }
    const double mse = se / static_cast<double>(a.pixels.size());
    const double psnr = mse == 0 ? INFINITY : 10.0 * std::log10(255.0 * 255.0 / mse);
    std::printf("drift: latents relative %.4g, max |diff| %.4g; image PSNR %.2f dB\n", rel, max_abs, psnr);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fluxmpi-bench-drift: %s\n", e.what());
    return 3;
  }
}
