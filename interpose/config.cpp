#include "interpose/config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <string_view>

namespace gmem {

namespace {

bool parse_value(std::string_view text, config_type::flag& out, std::string& expected) {
  expected = "0 or 1";
  if (text == "1" || text == "true") return out = true, true;
  if (text == "0" || text == "false") return out = false, true;
  return false;
}

bool parse_value(std::string_view text, config_type::level& out, std::string& expected) {
  static constexpr const char* names[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  static_assert(std::size(names) == std::size_t(LogLevel::off) + 1);
  expected = "one of trace, debug, info, warn, error, critical, off";
  for (std::size_t l = 0; l < std::size(names); ++l) {
    if (text == names[l]) {
      out = static_cast<config_type::level>(l);
      return true;
    }
  }
  return false;
}

bool parse_value(std::string_view text, config_type::source& out, std::string& expected) {
  expected = "driver or vmm";
  if (text == "driver") return out = config_type::source::driver, true;
  if (text == "vmm") return out = config_type::source::vmm, true;
  return false;
}

// A number from 0 to `most` into `out`.
bool parse_number(std::string_view text, double most, double& out) {
  std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || *end || !(value >= 0 && value <= most)) return false;
  out = value;
  return true;
}

bool parse_value(std::string_view text, config_type::percent& out, std::string& expected) {
  expected = "a percentage from 0 to 1000";
  return parse_number(text, 1000, out);
}

bool parse_value(std::string_view text, config_type::amount& out, std::string& expected) {
  expected = "a size in bytes with an optional K, M, G or T suffix (64G), or a percentage (50%)";
  std::string copy(text);
  if (copy.empty() || !std::isdigit(static_cast<unsigned char>(copy.front()))) return false;
  char* end = nullptr;
  if (copy.back() == '%') {
    double value = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size() - 1 || !(value >= 0 && value <= 100)) return false;
    out = pool::Amount::of_share(value / 100);
    return true;
  }
  errno = 0;
  unsigned long long value = std::strtoull(copy.c_str(), &end, 10);
  int shift = 0;
  switch (*end) {
    case 'K': case 'k': shift = 10; ++end; break;
    case 'M': case 'm': shift = 20; ++end; break;
    case 'G': case 'g': shift = 30; ++end; break;
    case 'T': case 't': shift = 40; ++end; break;
    default: break;
  }
  if (*end || errno == ERANGE || value > (~0ull >> shift)) return false;
  out = pool::Amount::of_bytes(value << shift);
  return true;
}

bool parse_value(std::string_view text, config_type::mem_info& out, std::string& expected) {
  expected = "device or tiers";
  if (text == "device") return out = pool::MemInfo::device, true;
  if (text == "tiers") return out = pool::MemInfo::tiers, true;
  return false;
}

bool parse_value(std::string_view text, config_type::bring_in& out, std::string& expected) {
  expected = "off, tried or always";
  if (text == "off") return out = pool::BringIn::off, true;
  if (text == "tried") return out = pool::BringIn::tried, true;
  if (text == "always") return out = pool::BringIn::always, true;
  return false;
}

bool parse_value(std::string_view text, config_type::evict& out, std::string& expected) {
  expected = "0, 1 or tried";
  if (text == "0") return out = pool::Evict::off, true;
  if (text == "1") return out = pool::Evict::always, true;
  if (text == "tried") return out = pool::Evict::tried, true;
  return false;
}

bool parse_value(std::string_view text, config_type::millis& out, std::string& expected) {
  expected = "a whole number of milliseconds, at most 3600000";
  std::string copy(text);
  if (copy.empty() || !std::isdigit(static_cast<unsigned char>(copy.front()))) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(copy.c_str(), &end, 10);
  if (*end || errno == ERANGE || value > 3'600'000) return false;
  out = config_type::millis(value);
  return true;
}

bool parse_value(std::string_view text, config_type::gbps& out, std::string& expected) {
  expected = "a rate in GB/s from 0 to 100000";
  return parse_number(text, 100000, out.value);
}

bool parse_value(std::string_view text, config_type::path& out, std::string& expected) {
  expected = "an absolute path";
  if (text.empty() || text.front() != '/') return false;
  out = text;
  return true;
}

bool parse_value(std::string_view text, config_type::optional_path& out, std::string& expected) {
  expected = "an absolute path, or nothing";
  if (!text.empty() && text.front() != '/') return false;
  out.path = text;
  return true;
}

bool parse_value(std::string_view text, config_type::plan& out, std::string& expected) {
  out.automatic = text == "auto";
  if (out.automatic) return out.path.clear(), true;
  const bool parsed = parse_value(text, static_cast<config_type::optional_path&>(out), expected);
  expected = "an absolute path, auto, or nothing";
  return parsed;
}

// Reads one key:value pair into `config`; returns an error message or "".
std::string apply(Config& config, std::string_view key, std::string_view value) {
  std::string expected;
#define GMEM_CONFIG_APPLY(name, type, default_value, doc)                                      \
  if (key == #name) {                                                                          \
    if (parse_value(value, config.name, expected)) return "";                                  \
    return "bad value '" + std::string(value) + "' for key '" #name "' (expected " + expected + \
           ")";                                                                                \
  }
  GMEM_CONFIG_KEYS(GMEM_CONFIG_APPLY)
#undef GMEM_CONFIG_APPLY
  return "unknown key '" + std::string(key) + "' (valid keys: " + config_key_list() + ")";
}

}  // namespace

Config::Config() {
  std::string ignored;
#define GMEM_CONFIG_DEFAULT(name, type, default_value, doc) parse_value(default_value, name, ignored);
  GMEM_CONFIG_KEYS(GMEM_CONFIG_DEFAULT)
#undef GMEM_CONFIG_DEFAULT
}

std::string config_key_list() {
  std::string keys;
#define GMEM_CONFIG_NAME(name, type, default_value, doc) keys += (keys.empty() ? "" : ", ") + std::string(#name);
  GMEM_CONFIG_KEYS(GMEM_CONFIG_NAME)
#undef GMEM_CONFIG_NAME
  return keys;
}

ConfigResult parse_config(const char* text) {
  ConfigResult result;
  std::string_view rest = text ? text : "";
  while (!rest.empty()) {
    std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      result.error = "'" + std::string(item) + "' is not key:value (valid keys: " + config_key_list() + ")";
      return result;
    }
    result.error = apply(result.config, item.substr(0, colon), item.substr(colon + 1));
    if (!result.error.empty()) return result;
  }
  return result;
}

}  // namespace gmem
