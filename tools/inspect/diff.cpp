#include "diff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/error.h"

namespace fluxmpi::inspect {
namespace {

std::string shape_text(at::IntArrayRef s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += str_cat(i ? ", " : "", s[i]);
  return t + "]";
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

void line(std::ostream& out, const std::string& name, const std::string& abs, const std::string& rel,
          const std::string& note) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-48s %12s %12s", name.c_str(), abs.c_str(), rel.c_str());
  out << buf << (note.empty() ? "" : "  " + note) << "\n";
}

}  // namespace

bool diff_checkpoints(const ckpt::CheckpointReader& file, const ckpt::CheckpointReader& reference,
                      std::optional<int64_t> image, double tol, std::ostream& out) {
  out << "comparing " << file.path() << " with reference " << reference.path() << " (tolerance " << tol
      << " on max |diff| / max(1, max |reference|))\n";
  if (file.num_images() != reference.num_images()) {
    out << "result: the checkpoints hold " << file.num_images() << " and " << reference.num_images()
        << " images: DIFFERENT\n";
    return false;
  }
  line(out, "dataset", "max |diff|", "relative", "");
  bool ok = true;
  double worst = 0;
  int64_t compared = 0;
  const int64_t first = image ? *image : 0;
  const int64_t last = image ? *image + 1 : file.num_images();
  for (int64_t i = first; i < last; ++i) {
    ckpt::ImageStatus a = file.state(i).status, b = reference.state(i).status;
    if (a != b) {
      line(out, ckpt::image_object(i, "status"), "-", "-",
           str_cat("'", ckpt::status_name(a), "' vs '", ckpt::status_name(b), "': DIFFERENT"));
      ok = false;
    }
    for (const ckpt::DatasetSpec& spec : ckpt::dataset_specs(file.shape(i))) {
      if (spec.type == ckpt::StoredType::String) continue;
      const std::string name = ckpt::image_object(i, spec.name);
      at::Tensor x = file.dataset(i, spec.name).to(at::kDouble);
      ++compared;
      at::Tensor r;
      try {
        r = reference.dataset(i, spec.name).to(at::kDouble);
      } catch (const CheckpointError&) {  // e.g. negative_* datasets of true CFG on one side only
        line(out, name, "-", "-", "not in the reference: DIFFERENT");
        ok = false;
        continue;
      }
      if (x.sizes() != r.sizes()) {
        line(out, name, "-", "-", str_cat("shape ", shape_text(x.sizes()), " vs ", shape_text(r.sizes()), ": DIFFERENT"));
        ok = false;
        continue;
      }
      double abs = x.numel() == 0 ? 0.0 : (x - r).abs().max().item<double>();
      double ref = r.numel() == 0 ? 0.0 : r.abs().max().item<double>();
      double rel = abs / std::max(1.0, ref);
      if (std::isnan(rel)) rel = std::numeric_limits<double>::infinity();
      worst = std::max(worst, rel);
      bool above = !(rel <= tol);
      ok = ok && !above;
      line(out, name, number(abs), number(rel), above ? "ABOVE TOLERANCE" : "");
    }
  }
  out << "result: " << compared << " datasets, max relative difference " << number(worst)
      << (ok ? " within tolerance " : ": DIFFERENT (tolerance ") << tol << (ok ? "" : ")") << "\n";
  return ok;
}

}  // namespace fluxmpi::inspect
