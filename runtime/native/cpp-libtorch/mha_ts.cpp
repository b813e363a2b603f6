// mha_ts: load the TorchScript artifact (mha.pt) with libtorch and check it against the golden fixtures.
//
//   mha_ts check ARTIFACT_DIR      every TorchScript case of golden/cases.tsv; last line "N passed, N failed"
//
// Like the C runner (and with its code: runtime/native/common/), nothing is used before it is verified:
// manifest.json is required; cases.tsv, each golden file and mha.pt are checked against its size and
// sha256 (the model is loaded from the verified bytes); each line of cases.tsv is validated against
// the manifest's config before a buffer is sized from it; the config.json embedded in mha.pt must
// equal the manifest's; inputs must be finite. Every libtorch call runs inside a try: a failure is
// that case's FAIL line, never a crash.
#include <torch/script.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "artifact.h"

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// An owner for the malloc'd buffers the C helpers return.
struct Freer { void operator()(void* p) const { std::free(p); } };
template <typename T> using CBuffer = std::unique_ptr<T, Freer>;

struct Manifest {
  MhaManifest m{};
  ~Manifest() { mha_manifest_free(&m); }
};

struct CaseLine {
  MhaCase c{};
  ~CaseLine() { mha_case_free(&c); }
};

// golden/NAME read against the manifest as count finite float32 values; empty with why set on failure.
std::vector<float> golden(const MhaManifest& m, const std::string& dir, const std::string& name, size_t count,
                          std::string& why) {
  char err[1024];
  unsigned char* raw = nullptr;
  size_t len = 0;
  const std::string rel = "golden/" + name;
  if (mha_read_verified(&m, dir.c_str(), rel.c_str(), &raw, &len, err, sizeof err)) {
    why = err;
    return {};
  }
  CBuffer<unsigned char> bytes(raw);
  float* values = nullptr;
  if (mha_floats(bytes.get(), len, count, (dir + "/" + rel).c_str(), &values, err, sizeof err)) {
    why = err;
    return {};
  }
  CBuffer<float> owned(values);
  return std::vector<float>(values, values + count);
}

struct Loaded {
  std::string file;
  torch::jit::Module module;
  MhaConfig cfg{};
  std::string error;  // why the model was refused, for each of its cases
  bool ok = false;
};

// mha.pt from its verified bytes; its embedded config.json must equal the manifest's config.
void load(Loaded& l, const std::string& dir, const std::string& file, const MhaManifest& m) {
  if (l.file == file) return;
  l = Loaded{};
  l.file = file;
  char err[1024];
  unsigned char* raw = nullptr;
  size_t len = 0;
  if (mha_read_verified(&m, dir.c_str(), file.c_str(), &raw, &len, err, sizeof err)) {
    l.error = err;
    return;
  }
  CBuffer<unsigned char> bytes(raw);
  const std::string path = dir + "/" + file;
  torch::jit::ExtraFilesMap extra{{"config.json", ""}};
  try {
    std::istringstream stream(std::string(reinterpret_cast<const char*>(bytes.get()), len));
    l.module = torch::jit::load(stream, torch::kCPU, extra);
    l.module.eval();
  } catch (const std::exception& e) {
    l.error = path + ": torch::jit::load failed: " + first_line(e.what());
    return;
  } catch (...) {
    l.error = path + ": torch::jit::load failed with an unknown exception";
    return;
  }
  const std::string& json = extra["config.json"];
  const std::string where = path + ": embedded config.json";
  if (json.empty()) {
    l.error = where + ": expected the config, found none";
    return;
  }
  if (mha_config_parse(json.data(), json.size(), where.c_str(), &l.cfg, err, sizeof err) ||
      mha_config_same(&l.cfg, where.c_str(), &m.config, m.path, err, sizeof err)) {
    l.error = err;
    return;
  }
  l.ok = true;
}

// One TorchScript case: true when it passed (its line printed either way).
bool check_case(const std::string& dir, const MhaManifest& m, Loaded& l, const MhaCase& c) {
  std::string why;
  MhaCompare r{0, 0, 0};
  load(l, dir, c.file, m);
  if (!l.ok) why = l.error;
  std::vector<float> x, want;
  if (why.empty()) x = golden(m, dir, c.input_bin, c.input_count, why);
  if (why.empty()) want = golden(m, dir, c.output_bin, c.output_count, why);
  if (why.empty()) {
    try {
      torch::NoGradGuard no_grad;
      auto input = torch::from_blob(x.data(), {c.batch, c.tokens, c.d_in}, torch::kFloat32);  // (B, T, d_in)
      auto result = l.module.forward({input});
      if (!result.isTensor()) {
        why = "forward: expected a tensor, got " + result.tagKind();
      } else {
        auto out = result.toTensor();  // (B, T, H * d_out)
        const std::vector<int64_t> expected{c.batch, c.tokens, c.width};
        if (out.scalar_type() != torch::kFloat32 || out.sizes().vec() != expected) {
          std::ostringstream shape;
          shape << out.sizes();
          why = "output: expected float32 [" + std::to_string(c.batch) + ", " + std::to_string(c.tokens) + ", " +
                std::to_string(c.width) + "], got " + std::string(c10::toString(out.scalar_type())) + " " + shape.str();
        } else {
          out = out.contiguous();
          r = mha_compare(out.data_ptr<float>(), want.data(), c.output_count, c.atol, c.rtol, c.has_rel_l2, c.rel_l2);
        }
      }
    } catch (const std::exception& e) {
      why = std::string("libtorch: ") + first_line(e.what());
    } catch (...) {
      why = "libtorch: unknown exception";
    }
  }
  std::ostringstream line;
  line << (why.empty() && r.ok ? "ok   " : "FAIL ") << c.file << " " << c.name << " ";
  if (!why.empty()) line << why;
  else line << "max_abs=" << r.max_abs << " rel_l2=" << r.rel_l2 << (r.ok ? "" : " atol=" + std::to_string(c.atol));
  if (why.empty() && !r.ok && c.has_rel_l2) line << " rel_l2<=" << c.rel_l2;
  std::cout << line.str() << "\n";
  return why.empty() && r.ok;
}

int check_dir(const std::string& dir) {
  const std::string tsv_path = dir + "/golden/cases.tsv";
  struct stat st;
  if (stat(tsv_path.c_str(), &st) != 0) {
    std::cerr << "error: " << tsv_path << ": expected golden fixtures (made by `mha export`), found none\n";
    return 1;
  }
  Manifest manifest;
  char err[1024];
  if (mha_manifest_load(dir.c_str(), &manifest.m, err, sizeof err)) {
    std::cerr << "error: " << err << "\n";
    return 1;
  }
  unsigned char* raw = nullptr;
  size_t len = 0;
  if (mha_read_verified(&manifest.m, dir.c_str(), "golden/cases.tsv", &raw, &len, err, sizeof err)) {
    std::cerr << "error: " << err << "\n";
    return 1;
  }
  std::string text(reinterpret_cast<const char*>(raw), len);
  std::free(raw);
  if (text.find('\0') != std::string::npos) {
    std::cerr << "error: " << tsv_path << ": expected text, found a NUL byte\n";
    return 1;
  }
  Loaded loaded;
  int passed = 0, failed = 0;
  std::istringstream lines(text);
  long number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    CaseLine parsed;
    MhaCase& c = parsed.c;
    if (mha_case_parse(line.data(), &manifest.m.config, &c, err, sizeof err)) {
      if (!c.split) {
        std::cout << "FAIL " << tsv_path << " line " << number << ": " << err << "\n";
        ++failed;
      } else if (std::string(c.runtime) == "torchscript") {
        std::cout << "FAIL " << c.file << " " << c.name << " " << err << "\n";
        ++failed;
      }
      continue;
    }
    if (std::string(c.runtime) != "torchscript") continue;  // ONNX: the C and Node runners' job
    check_case(dir, manifest.m, loaded, c) ? ++passed : ++failed;
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  if (passed + failed == 0) std::cerr << "error: " << tsv_path << ": no TorchScript case found\n";
  return failed > 0 || passed == 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "check") {
    std::cerr << "usage: mha_ts check ARTIFACT_DIR\n";
    return 2;
  }
  try {
    return check_dir(argv[2]);
  } catch (const std::exception& e) {  // std::bad_alloc and the like: still one line, never a crash
    std::cerr << "error: " << first_line(e.what()) << "\n";
    return 1;
  }
}
