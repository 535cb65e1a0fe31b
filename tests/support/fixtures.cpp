#include "support/fixtures.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fluxmpi::test {
namespace fs = std::filesystem;

std::string fixture_root() {
  if (const char* env = std::getenv("FLUXMPI_FIXTURES"); env && *env) return env;
  return (fs::path(FLUXMPI_SOURCE_DIR) / ".." / "shared" / "fixtures").lexically_normal().string();
}

std::string assets_root() {
  if (const char* env = std::getenv("FLUXMPI_ASSETS"); env && *env) return env;
  return (fs::path(FLUXMPI_SOURCE_DIR) / ".." / "shared" / "assets").lexically_normal().string();
}

bool fixtures_present() {
  std::error_code ec;
  return fs::is_regular_file(fs::path(fixture_root()) / "manifest.json", ec);
}

bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

std::string missing_fixtures_message() {
  return "fixture tree not found: no manifest.json in '" + fixture_root() +
         "' (set FLUXMPI_FIXTURES to a fixture tree; under CI=true this is a failure)";
}

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(fs::path(fixture_root()) / "manifest.json");
    if (!in) throw std::runtime_error(missing_fixtures_message());
    return nlohmann::json::parse(in);
  }();
  return m;
}

std::vector<CaseRef> cases_of_kind(const std::string& kind) {
  std::vector<CaseRef> out;
  if (!fixtures_present()) {
    out.push_back(CaseRef{});
    return out;
  }
  const auto& m = manifest();
  for (auto it = m["pipelines"].begin(); it != m["pipelines"].end(); ++it) {
    for (const auto& c : it.value()["cases"]) {
      if (c.value("kind", "") != kind) continue;
      CaseRef r;
      r.pipeline = it.key();
      r.name = c["name"].get<std::string>();
      r.kind = kind;
      r.file = (fs::path(fixture_root()) / c["file"].get<std::string>()).string();
      r.model_dir = (fs::path(fixture_root()) / it.value()["path"].get<std::string>()).string();
      r.json = c;
      r.pipeline_json = it.value();
      out.push_back(std::move(r));
    }
  }
  if (out.empty()) out.push_back(CaseRef{});
  return out;
}

bool single_file_fixtures_present() {
  std::error_code ec;
  return fs::is_regular_file(fs::path(fixture_root()) / "single-file" / "manifest.json", ec);
}

std::vector<CaseRef> single_file_cases() {
  std::vector<CaseRef> out;
  if (!single_file_fixtures_present()) return {CaseRef{}};
  const fs::path dir = fs::path(fixture_root()) / "single-file";
  std::ifstream in(dir / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  for (auto it = m["single_file"].begin(); it != m["single_file"].end(); ++it) {
    for (const auto& c : it.value()["cases"]) {
      CaseRef r;
      r.pipeline = it.key();
      r.name = c["name"].get<std::string>();
      r.kind = c.value("weights", "");
      r.file = (dir / c["file"].get<std::string>()).string();
      r.model_dir = (dir / it.value()["model_config"].get<std::string>()).lexically_normal().string();
      r.json = c;
      r.pipeline_json = it.value();
      out.push_back(std::move(r));
    }
  }
  if (out.empty()) out.push_back(CaseRef{});
  return out;
}

std::string single_file_dir(const CaseRef& c) {
  return (fs::path(fixture_root()) / "single-file" / c.pipeline_json["files_dir"].get<std::string>()).string();
}

std::string case_test_name(const testing::TestParamInfo<CaseRef>& info) {
  if (info.param.pipeline.empty()) return "no_fixtures";
  std::string s = info.param.pipeline + "__" + info.param.name;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::string case_label(const CaseRef& c) { return c.pipeline + "/" + c.name; }

void PrintTo(const CaseRef& c, std::ostream* os) { *os << (c.pipeline.empty() ? "no fixtures" : case_label(c)); }

std::vector<TokenizerCase> tokenizer_cases() {
  std::ifstream in(fixture_root() + "/tokenizer_cases.json");
  if (!in) return {TokenizerCase{}};
  const nlohmann::json all = nlohmann::json::parse(in);
  std::vector<TokenizerCase> out;
  for (const auto& c : all["cases"]) out.push_back({c["id"].get<std::string>(), c});
  if (out.empty()) out.push_back(TokenizerCase{});
  return out;
}

std::string tokenizer_case_name(const testing::TestParamInfo<TokenizerCase>& info) {
  if (info.param.id.empty()) return "no_fixtures";
  std::string s = info.param.id;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

void PrintTo(const TokenizerCase& c, std::ostream* os) { *os << (c.id.empty() ? "<no fixtures>" : c.id); }

std::string first_difference(const std::vector<int64_t>& got, const std::vector<int64_t>& want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (got[i] != want[i])
      return "position " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  return "lengths " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
}

}  // namespace fluxmpi::test
