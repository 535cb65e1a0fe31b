// fluxmpi-inspect FILE.h5 [--image I] [--step K] [--stats] [--preview out.png] [--latent x0|noisy]
//                 [--decode out.png [--model DIR|FILE]] [--diff OTHER.h5 --tol T] [--follow [--timeout S]]
// Parses the command line and runs inspect::run_inspect; errors become one line and an exit code.

#include <boost/program_options.hpp>

#include <iostream>

#include "core/error.h"
#include "core/version.h"
#include "inspect.h"

namespace po = boost::program_options;
using namespace fluxmpi;

namespace {

template <typename T>
std::optional<T> optional_value(const po::variables_map& vm, const char* name) {
  return vm.count(name) ? std::optional<T>(vm[name].as<T>()) : std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description visible(
      "Usage: fluxmpi-inspect FILE.h5 [options]\n"
      "Shows what a fluxmpi HDF5 checkpoint holds (one line per image), and on request per-step latent\n"
      "statistics, a preview or VAE decode of any stored step, a comparison with another checkpoint,\n"
      "or the progress of a running job.\n\n"
      "Exit codes: 0 ok, 1 --diff above tolerance or --follow timed out, 2 usage error, 3 not a valid\n"
      "fluxmpi checkpoint (or bad model files)\n\nOptions");
  // clang-format off
  visible.add_options()
      ("help,h", "show this help")
      ("version", "show the fluxmpi version")
      ("image", po::value<int64_t>(), "only image I (0-based; --preview/--decode default: 0)")
      ("step", po::value<int64_t>(), "stored step K for --stats/--preview/--decode (default: the last stored; -1: the initial noise)")
      ("stats", "per stored step: sigma, mean, std, min, max and L2 norm of the latents")
      ("preview", po::value<std::string>(), "write a fast linear latent-to-RGB preview PNG")
      ("latent", po::value<std::string>(), "what --preview/--decode show: x0 (predicted clean latent, default) or noisy")
      ("decode", po::value<std::string>(), "decode the latents with the model's VAE to a PNG")
      ("model", po::value<std::string>(), "model folder, or a file holding the VAE, for --decode (default: the VAE the checkpoint records)")
      ("diff", po::value<std::string>(), "compare every dataset with the reference checkpoint OTHER.h5")
      ("tol", po::value<double>(), "--diff tolerance on max|diff| / max(1, max|reference|) (default 0: identical)")
      ("follow", "print progress lines of a running job until every image is decoded")
      ("timeout", po::value<double>(), "--follow: give up after S seconds (exit 1)")
      ("interval", po::value<double>(), "--follow: seconds between looks (default 1)");
  // clang-format on
  po::options_description all;
  all.add(visible).add_options()("file", po::value<std::string>(), "checkpoint");
  po::positional_options_description positional;
  positional.add("file", 1);

  try {
    po::variables_map vm;
    try {
      po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
      po::notify(vm);
    } catch (const po::error& e) {
      throw UsageError(e.what());
    }
    if (vm.count("help")) {
      std::cout << visible << "\n";
      return kExitOk;
    }
    if (vm.count("version")) {
      std::cout << "fluxmpi-inspect " << kVersion << "\n";
      return kExitOk;
    }
    if (!vm.count("file")) throw UsageError("no checkpoint given (fluxmpi-inspect FILE.h5 [options]; --help)");
    inspect::InspectOptions o;
    o.file = vm["file"].as<std::string>();
    o.image = optional_value<int64_t>(vm, "image");
    o.step = optional_value<int64_t>(vm, "step");
    o.stats = vm.count("stats") > 0;
    o.preview = optional_value<std::string>(vm, "preview").value_or("");
    o.decode = optional_value<std::string>(vm, "decode").value_or("");
    o.model = optional_value<std::string>(vm, "model").value_or("");
    o.latent = optional_value<std::string>(vm, "latent");
    o.diff = optional_value<std::string>(vm, "diff").value_or("");
    o.tol = optional_value<double>(vm, "tol");
    o.follow = vm.count("follow") > 0;
    o.timeout = optional_value<double>(vm, "timeout");
    o.interval = optional_value<double>(vm, "interval");
    return inspect::run_inspect(o, std::cout);
  } catch (const Error& e) {
    std::cout.flush();
    std::cerr << "fluxmpi-inspect: " << e.kind() << ": " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "fluxmpi-inspect: error: " << e.what() << "\n";
    return kExitFailure;
  }
}
