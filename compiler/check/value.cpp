#include "compiler/check/value.h"

#include <fmt/format.h>

#include <cmath>

#include "compiler/check/eval_internal.h"

namespace paraplan::eval {
namespace {

std::string Real(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{:.6g}", v);
}

std::string WithUnit(double v, UnitDimension d) {
  struct Step {
    double scale;
    const char* unit;
  };
  static const Step kBytes[] = {
      {1099511627776.0, "TiB"}, {1073741824.0, "GiB"}, {1048576.0, "MiB"}, {1024.0, "KiB"}};
  static const Step kBandwidth[] = {{1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "KB/s"}};
  static const Step kFlops[] = {{1e15, "PFLOPS"}, {1e12, "TFLOPS"}, {1e9, "GFLOPS"}};
  static const Step kTime[] = {{1, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}};
  auto pick = [&](const auto& steps, const char* base) {
    for (const Step& s : steps) {
      if (std::fabs(v) >= s.scale) return Real(v / s.scale) + " " + s.unit;
    }
    return Real(v) + " " + base;
  };
  switch (d) {
    case UnitDimension::kBytes: {
      // Exact binary multiples read best as such; other byte counts stay exact.
      for (const Step& s : kBytes) {
        if (std::fabs(v) >= s.scale && std::fmod(v, s.scale) == 0)
          return Real(v / s.scale) + " " + s.unit;
      }
      if (v >= 1e9 && std::fmod(v, 1e9) == 0) return Real(v / 1e9) + " GB";
      return Real(v) + " B";
    }
    case UnitDimension::kBandwidth:
      return pick(kBandwidth, "B/s");
    case UnitDimension::kFlops:
      return pick(kFlops, "FLOPS");
    case UnitDimension::kTime:
      return pick(kTime, "s");
  }
  return Real(v);
}

}  // namespace

std::string Describe(const Value& v) {
  switch (v.type) {
    case VType::kError:
      return "an error";
    case VType::kInt:
    case VType::kReal:
      if (v.dim) {
        switch (*v.dim) {
          case UnitDimension::kBytes:
            return "a size in bytes";
          case UnitDimension::kBandwidth:
            return "a bandwidth";
          case UnitDimension::kFlops:
            return "a compute rate";
          case UnitDimension::kTime:
            return "a time";
        }
      }
      return v.type == VType::kInt ? "an integer" : "a real number";
    case VType::kBool:
      return "a boolean";
    case VType::kString:
      return v.enum_name ? "a name" : "a string";
    case VType::kList:
      return "a list";
    case VType::kRecord:
      return fmt::format("a `{}` record", KindName(v.rec->kind));
    case VType::kAuto:
      return "`auto`";
  }
  return "a value";
}

std::string Format(const Value& v) {
  switch (v.type) {
    case VType::kError:
      return "<error>";
    case VType::kInt:
      if (v.dim) return WithUnit(static_cast<double>(v.i), *v.dim);
      return fmt::format("{}", v.i);
    case VType::kReal:
      if (v.dim) return WithUnit(v.r, *v.dim);
      return Real(v.r);
    case VType::kBool:
      return v.b ? "true" : "false";
    case VType::kString:
      return v.enum_name ? v.s : fmt::format("\"{}\"", v.s);
    case VType::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += Format((*v.list)[k]);
      }
      return out + "]";
    }
    case VType::kRecord:
      return v.rec->name.empty() ? std::string(KindName(v.rec->kind)) : v.rec->name;
    case VType::kAuto:
      return "auto";
  }
  return "?";
}

std::string FormatForSet(const Value& v) {
  switch (v.type) {
    case VType::kInt:
      return fmt::format("{}", v.i);
    case VType::kReal:
      return fmt::format("{}", v.r);
    case VType::kString: {
      std::string out = "\"";
      for (char c : v.s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      return out + "\"";
    }
    default:
      return Format(v);
  }
}

}  // namespace paraplan::eval
