#pragma once
// The raw values of fluxmpi's options as the command line and the INI file give them, each with
// where it came from, and their conversions with messages that name the option, the value and,
// for the INI file's values, the file. Internal to the options: not part of the library's interface.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "app/job.h"
#include "app/option_table.h"
#include "core/error.h"

namespace fluxmpi::app::options {

// The raw option values, each with where it came from.
class Settings {
 public:
  struct Value {
    std::string text;
    std::string source;  // "" = command line, else the INI file
  };

  bool has(const std::string& name) const { return values_.count(name) != 0 || lists_.count(name) != 0; }
  void set(const std::string& name, Value v) { values_[name] = std::move(v); }
  // Repeatable options: every value in order.
  void append(const std::string& name, Value v) { lists_[name].push_back(std::move(v)); }
  std::vector<Value> list(const std::string& name) const {
    auto it = lists_.find(name);
    return it == lists_.end() ? std::vector<Value>() : it->second;
  }
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& [name, v] : values_) out.insert(name);
    for (const auto& [name, v] : lists_) out.insert(name);
    return out;
  }

  [[noreturn]] void fail(const std::string& name, const std::string& problem) const {
    auto it = values_.find(name);
    std::string where = it != values_.end() && !it->second.source.empty()
                            ? str_cat(" (set in config file '", it->second.source, "')")
                            : std::string();
    throw UsageError(str_cat("--", name, " ", problem, where));
  }
  [[noreturn]] void fail(const Value& v, const std::string& name, const std::string& problem) const {
    throw UsageError(str_cat("--", name, " ", problem,
                             v.source.empty() ? std::string() : str_cat(" (set in config file '", v.source, "')")));
  }

  std::optional<std::string> optional_text(const std::string& name) const {
    auto it = values_.find(name);
    if (it != values_.end()) return it->second.text;
    const Spec* spec = find_spec(name);
    if (spec && spec->fallback) return std::string(spec->fallback);
    return std::nullopt;
  }
  std::string text(const std::string& name) const { return optional_text(name).value_or(""); }

  std::string choice(const std::string& name, std::initializer_list<const char*> allowed) const {
    std::string v = text(name);
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return v;
      list += list.empty() ? a : str_cat(", ", a);
    }
    fail(name, str_cat("must be one of ", list, ", got '", v, "'"));
  }

  std::optional<int64_t> integer(const std::string& name, int64_t min, int64_t max) const {
    auto v = optional_text(name);
    if (!v) return std::nullopt;
    int64_t out = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (ec == std::errc::result_out_of_range) fail(name, str_cat("is out of range, got '", *v, "'"));
    if (ec != std::errc() || end != v->data() + v->size() || v->empty())
      fail(name, str_cat("must be an integer, got '", *v, "'"));
    if (out < min) {
      std::string rule = min == 1 ? std::string("must be positive")
                         : min == 0 ? std::string("must not be negative")
                                    : str_cat("must be at least ", min);
      fail(name, str_cat(rule, ", got ", out));
    }
    if (out > max) fail(name, str_cat("must be at most ", max, ", got ", out));
    return out;
  }

  // A finite number >= min; `rule` says why when it is smaller.
  std::optional<double> number(const std::string& name, double min, const std::string& rule) const {
    auto v = optional_text(name);
    if (!v) return std::nullopt;
    double out = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (ec != std::errc() || end != v->data() + v->size() || v->empty())
      fail(name, str_cat("must be a number, got '", *v, "'"));
    if (!std::isfinite(out)) fail(name, str_cat("must be a finite number, got '", *v, "'"));
    if (out < min) fail(name, str_cat(rule, ", got ", *v));
    return out;
  }

  bool flag(const std::string& name) const {
    auto v = optional_text(name);
    if (!v) return false;
    std::string t = *v;
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
    if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
    if (t == "false" || t == "no" || t == "off" || t == "0") return false;
    fail(name, str_cat("must be true or false, got '", *v, "'"));
  }

  void require_utf8(const std::string& name) const {
    auto v = optional_text(name);
    if (!v) return;
    size_t bad = find_invalid_utf8(*v);
    if (bad != std::string_view::npos) fail(name, str_cat("is not valid UTF-8 (byte ", bad + 1, ")"));
  }

 private:
  std::map<std::string, Value> values_;
  std::map<std::string, std::vector<Value>> lists_;
};

/// Reads the command line `args` (without the program name): UsageError for an unknown option, a
/// missing or extra value, a stray argument, an option given twice (unless repeatable).
void read_command_line(const std::vector<std::string>& args, Settings& settings);
/// Reads the INI file `path` into `settings`: the command line's values win; repeatable options
/// given on the command line ignore the file's lines. UsageError naming the file and the key.
void read_config_file(const std::string& path, Settings& settings);

}  // namespace fluxmpi::app::options
