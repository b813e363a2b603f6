// mha_ts: load the TorchScript artifact (mha.pt) with libtorch and check it against the golden fixtures.
//
//   mha_ts check ARTIFACT_DIR [--json FILE]   every TorchScript case of golden/cases.json; last line
//                                             "N passed, N failed"; --json FILE also writes the results
//                                             as JSON (common/report.h, "runtime": "cpp")
//
// Like the C runner (and with its code: runtime/native/common/), nothing is used before it is verified:
// manifest.json is required; cases.json, each golden file and mha.pt are checked against its size and
// sha256 (cases.json before it is parsed, the model loaded from the verified bytes); each (artifact, case)
// pair of cases.json is validated against the manifest's config (shapes, counts, tolerances) before a
// buffer is sized from it; the config.json embedded in mha.pt must equal the manifest's; inputs must be
// finite. Every libtorch call runs inside a try: a failure is that case's FAIL line, never a crash.
#include <torch/script.h>
#include <torch/version.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "artifact.h"
#include "report.h"

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// An owner for the malloc'd buffers the C helpers return.
struct Freer { void operator()(void* p) const { std::free(p); } };
template <typename T> using CBuffer = std::unique_ptr<T, Freer>;

struct Manifest {
  MhaManifest m{};
  ~Manifest() { mha_manifest_free(&m); }
};

struct CasesDoc {
  MhaCases doc{};
  ~CasesDoc() { mha_cases_free(&doc); }
};

struct CasePair {
  MhaCase c{};
  ~CasePair() { mha_case_free(&c); }
};

struct Report {
  MhaReport r{};
  ~Report() { mha_report_free(&r); }
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
  bool unloadable = false;  // torch::jit::load itself refused the bytes (the JSON's not_loadable)
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
    l.unloadable = true;
    return;
  } catch (...) {
    l.error = path + ": torch::jit::load failed with an unknown exception";
    l.unloadable = true;
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

// One TorchScript case: true when it passed (its line printed, and reported, either way).
bool check_case(const std::string& dir, const MhaManifest& m, Loaded& l, const MhaCase& c, MhaReport& report) {
  std::string why;
  MhaCompare r{0, 0, 0};
  load(l, dir, c.file, m);
  if (!l.ok) {
    why = l.error;
    if (l.unloadable) mha_report_not_loadable(&report, l.error.c_str());
    else mha_report_artifact_error(&report, l.error.c_str());
  }
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
  mha_report_case(&report, c.name, why.empty() ? &r : nullptr, why.empty() ? nullptr : why.c_str());
  return why.empty() && r.ok;
}

// A check that stops before any case: one line on stderr, and (with --json) the error as the result.
int stop(const std::string& dir, const char* json_path, const std::string& why) {
  std::cerr << "error: " << why << "\n";
  char err[1024];
  if (json_path && mha_report_write_error("cpp", dir.c_str(), why.c_str(), json_path, err, sizeof err))
    std::cerr << "error: " << err << "\n";
  return 1;
}

int check_dir(const std::string& dir, const char* json_path) {
  const std::string cases_path = dir + "/golden/cases.json";
  struct stat st;
  if (stat(cases_path.c_str(), &st) != 0)
    return stop(dir, json_path, cases_path + ": expected golden fixtures (made by `mha export`), found none");
  Manifest manifest;
  char err[1024];
  if (mha_manifest_load(dir.c_str(), &manifest.m, err, sizeof err)) return stop(dir, json_path, err);
  unsigned char* raw = nullptr;
  size_t len = 0;
  // verified against the manifest's size and sha256 before a byte of it is parsed
  if (mha_read_verified(&manifest.m, dir.c_str(), "golden/cases.json", &raw, &len, err, sizeof err))
    return stop(dir, json_path, err);
  CBuffer<unsigned char> bytes(raw);
  CasesDoc cases;
  if (mha_cases_parse(reinterpret_cast<const char*>(bytes.get()), len, cases_path.c_str(), &manifest.m.config,
                      &cases.doc, err, sizeof err))
    return stop(dir, json_path, err);
  bytes.reset();
  Loaded loaded;
  Report report;
  mha_report_init(&report.r, "cpp", dir.c_str());
#ifdef TORCH_VERSION
  mha_report_version(&report.r, "libtorch", TORCH_VERSION);
#endif
  int passed = 0, failed = 0;
  const MhaCases& doc = cases.doc;
  for (size_t a = 0; a < doc.nartifacts; ++a) {
    for (size_t i = 0; i < doc.ncases; ++i) {
      CasePair pair;
      MhaCase& c = pair.c;
      if (mha_case_get(&doc, a, i, &manifest.m.config, &c, err, sizeof err)) {
        if (!c.split) {  // no usable file, runtime or name: whose it is cannot be told; every runner fails it
          const std::string line = cases_path + " artifacts[" + std::to_string(a) + "] cases[" + std::to_string(i) +
                                   "]: " + err;
          std::cout << "FAIL " << line << "\n";
          mha_report_error(&report.r, line.c_str());
          ++failed;
        } else if (std::string(c.runtime) == MHA_TORCHSCRIPT_RUNTIME) {
          std::cout << "FAIL " << c.file << " " << c.name << " " << err << "\n";
          mha_report_artifact(&report.r, a, c.file, c.runtime);
          mha_report_case(&report.r, c.name, nullptr, err);
          ++failed;
        }
        continue;
      }
      if (std::string(c.runtime) != MHA_TORCHSCRIPT_RUNTIME) continue;  // ONNX: the C and Node runners' job
      mha_report_artifact(&report.r, a, c.file, c.runtime);
      check_case(dir, manifest.m, loaded, c, report.r) ? ++passed : ++failed;
    }
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  if (passed + failed == 0) std::cerr << "error: " << cases_path << ": no TorchScript case found\n";
  int rc = failed > 0 || passed == 0 ? 1 : 0;
  if (json_path) {
    std::cout.flush();
    if (report.r.passed != passed || report.r.failed != failed) {
      std::cerr << "error: " << json_path << ": the results kept (" << report.r.passed << " passed, " << report.r.failed
                << " failed) differ from the count; not written\n";
      rc = 1;
    } else if (mha_report_write(&report.r, json_path, err, sizeof err)) {
      std::cerr << "error: " << err << "\n";
      rc = 1;
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // check ARTIFACT_DIR [--json FILE], --json before or after the folder
  const char *dir = nullptr, *json_path = nullptr;
  bool usage = argc < 3 || std::string(argv[1]) != "check";
  for (int i = 2; !usage && i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc && !json_path && argv[i + 1][0]) json_path = argv[++i];
    else if (arg.rfind("--", 0) != 0 && !dir) dir = argv[i];
    else usage = true;
  }
  if (usage || !dir) {
    std::cerr << "usage: mha_ts check ARTIFACT_DIR [--json FILE]\n";
    return 2;
  }
  try {
    return check_dir(dir, json_path);
  } catch (const std::exception& e) {  // std::bad_alloc and the like: still one line, never a crash
    std::cerr << "error: " << first_line(e.what()) << "\n";
    return 1;
  }
}
