#include "app/option_settings.h"

#include <filesystem>
#include <fstream>

namespace fluxmpi::app::options {
namespace fs = std::filesystem;
namespace po = boost::program_options;

void read_command_line(const std::vector<std::string>& args, Settings& settings) {
  po::options_description table = full_table(false);
  po::options_description hidden;
  hidden.add_options()("unexpected-argument", po::value<std::vector<std::string>>());
  table.add(hidden);
  po::positional_options_description positional;
  positional.add("unexpected-argument", -1);
  // No abbreviations: `--step` must not silently mean `--steps`.
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args).options(table).positional(positional).style(style).run();
  } catch (const po::unknown_option& e) {
    throw UsageError(str_cat("unknown option '", e.get_option_name(), "' (see fluxmpi --help)"));
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_syntax::missing_parameter)
      throw UsageError(str_cat(e.get_option_name(), " needs a value"));
    if (e.kind() == po::invalid_syntax::extra_parameter)
      throw UsageError(str_cat(e.get_option_name(), " takes no value"));
    throw UsageError(e.what());
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  for (const po::option& o : parsed.options) {
    if (o.string_key == "unexpected-argument")
      throw UsageError(str_cat("unexpected argument '", o.value.empty() ? "" : o.value.front(),
                               "' (every value follows its option, e.g. --prompt \"a cat\")"));
    const Spec* spec = find_spec(o.string_key);
    if (spec != nullptr && spec->repeatable) {
      settings.append(o.string_key, {o.value.empty() ? std::string() : o.value.front(), ""});
      continue;
    }
    if (settings.has(o.string_key)) throw UsageError(str_cat("--", o.string_key, " is given more than once"));
    settings.set(o.string_key, {o.value.empty() ? "true" : o.value.front(), ""});
  }
}

namespace {

// INI values may be quoted to keep leading or trailing spaces: "a cat" -> a cat.
std::string unquote(const std::string& v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

// One prompt source: a command-line --prompt replaces an INI prompts-file and vice versa.
bool is_prompt_source(const std::string& key) { return key == "prompt" || key == "prompts-file"; }

}  // namespace

void read_config_file(const std::string& path, Settings& settings) {
  const std::string label = str_cat("config file '", path, "'");
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(str_cat("--config '", path, "': not found"));
  if (fs::is_directory(path, ec)) throw UsageError(str_cat("--config '", path, "': is a directory, not a file"));
  std::ifstream in(path);
  if (!in) throw UsageError(str_cat("--config '", path, "': cannot be read"));
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(in, full_table(true), /*allow_unregistered=*/true);
  } catch (const po::invalid_config_file_syntax& e) {
    throw UsageError(str_cat(label, ": invalid line '", e.tokens(), "' (expected key = value)"));
  } catch (const po::error& e) {
    throw UsageError(str_cat(label, ": ", e.what()));
  }
  const bool cli_prompt = settings.has("prompt") || settings.has("prompts-file");
  std::set<std::string> seen;
  std::set<std::string> cli_lists;  // repeatable options given on the command line: the INI's lines are ignored
  for (const Spec& s : all_specs())
    if (s.repeatable && settings.has(s.name)) cli_lists.insert(s.name);
  for (const po::option& o : parsed.options) {
    const std::string& key = o.string_key;
    if (o.unregistered) {
      const Spec* spec = find_spec(key);
      std::string hint = spec && spec->cli_only ? str_cat(" ('", key, "' can only be given on the command line)")
                         : key.find('.') != std::string::npos
                             ? std::string(" (keys are the long option names at the top level, without [sections])")
                             : std::string(" (keys are the long option names, see fluxmpi --help)");
      throw UsageError(str_cat(label, ": unknown key '", key, "'", hint));
    }
    if (const Spec* spec = find_spec(key); spec != nullptr && spec->repeatable) {
      if (!cli_lists.count(key)) settings.append(key, {unquote(o.value.empty() ? std::string() : o.value.front()), path});
      continue;
    }
    if (!seen.insert(key).second) throw UsageError(str_cat(label, ": key '", key, "' is set more than once"));
    if (settings.has(key) || (cli_prompt && is_prompt_source(key))) continue;  // the command line wins
    settings.set(key, {unquote(o.value.empty() ? std::string() : o.value.front()), path});
  }
}

}  // namespace fluxmpi::app::options
