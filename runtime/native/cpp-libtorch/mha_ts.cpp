// mha_ts: load the TorchScript artifact (mha.pt) with libtorch and check it against the golden fixtures.
//
//   mha_ts check ARTIFACT_DIR      every TorchScript case of golden/cases.tsv; last line "N passed, N failed"
//
// The contract (d_in, context_length) comes from the config.json embedded in mha.pt.
#include <torch/script.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

struct Config { long d_in = -1, d_out = -1, num_heads = -1, context_length = -1; };

static long json_int(const std::string& json, const std::string& key) {
  auto at = json.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::stol(json.substr(at + key.size() + 3));
}

static bool read_floats(const std::string& path, std::vector<float>& out, size_t count) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f || static_cast<size_t>(f.tellg()) != count * sizeof(float)) {
    std::cerr << "error: " << path << ": expected " << count << " float32 values\n";
    return false;
  }
  out.resize(count);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(float)));
  return true;  // little-endian on every machine this runs on (x86-64, arm64)
}

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "check") {
    std::cerr << "usage: mha_ts check ARTIFACT_DIR\n";
    return 2;
  }
  const std::string dir = argv[2];
  std::ifstream tsv(dir + "/golden/cases.tsv");
  if (!tsv) {
    std::cerr << "error: " << dir << "/golden/cases.tsv: expected golden fixtures (made by `mha export`), found none\n";
    return 1;
  }
  torch::NoGradGuard no_grad;
  torch::jit::Module module;
  Config cfg;
  std::string loaded;
  bool load_failed = false;
  int passed = 0, failed = 0;
  for (std::string line; std::getline(tsv, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string file, kind, runtime, rel, name, xin, yout, sched;
    double atol, rtol;
    long B, T, d_in, D;
    if (!(in >> file >> kind >> runtime >> atol >> rtol >> rel >> name >> B >> T >> d_in >> D >> xin >> yout >> sched)) {
      std::cerr << "error: malformed line in cases.tsv: " << line << "\n";
      ++failed;
      continue;
    }
    if (runtime != "torchscript") continue;
    if (file != loaded) {
      loaded = file;
      torch::jit::ExtraFilesMap extra{{"config.json", ""}};
      try {
        module = torch::jit::load(dir + "/" + file, torch::kCPU, extra);
        module.eval();
        load_failed = false;
      } catch (const std::exception& e) {
        std::string msg = e.what();
        std::cerr << "error: " << dir << "/" << file << ": torch::jit::load failed: " << msg.substr(0, msg.find('\n')) << "\n";
        load_failed = true;
      }
      const std::string& json = extra["config.json"];
      cfg = {json_int(json, "d_in"), json_int(json, "d_out"), json_int(json, "num_heads"), json_int(json, "context_length")};
    }
    std::string why;
    if (load_failed) why = "model did not load";
    else if (d_in != cfg.d_in) why = "expected last axis d_in=" + std::to_string(cfg.d_in) + ", got " + std::to_string(d_in);
    else if (B < 1) why = "expected batch >= 1, got " + std::to_string(B);
    else if (T < 1 || T > cfg.context_length)
      why = "expected 1 <= tokens <= context_length=" + std::to_string(cfg.context_length) + ", got " + std::to_string(T);
    std::vector<float> x, want;
    double max_abs = 0, diff2 = 0, ref2 = 0;
    bool ok = why.empty();
    if (ok && !(read_floats(dir + "/golden/" + xin, x, B * T * d_in) && read_floats(dir + "/golden/" + yout, want, B * T * D))) {
      why = "fixture files unreadable";
      ok = false;
    }
    if (ok) {
      auto input = torch::from_blob(x.data(), {B, T, d_in}, torch::kFloat32);  // (B, T, d_in)
      auto out = module.forward({input}).toTensor().contiguous();               // (B, T, H * d_out)
      if (out.numel() != B * T * D) { why = "output has the wrong size"; ok = false; }
      for (long i = 0; ok && i < B * T * D; ++i) {
        double a = out.data_ptr<float>()[i], e = want[i], diff = std::fabs(a - e);
        if (!std::isfinite(a) || diff > atol + rtol * std::fabs(e)) ok = false;
        max_abs = std::max(max_abs, std::isfinite(a) ? diff : INFINITY);
        diff2 += diff * diff;
        ref2 += e * e;
      }
    }
    double rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (ok && rel != "-" && rel_l2 > std::stod(rel)) ok = false;
    std::cout << (ok ? "ok   " : "FAIL ") << file << " " << name << " ";
    if (!why.empty()) std::cout << why << "\n";
    else std::cout << "max_abs=" << max_abs << " rel_l2=" << rel_l2 << "\n";
    ok ? ++passed : ++failed;
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  if (passed + failed == 0) std::cerr << "error: " << dir << "/golden/cases.tsv: no TorchScript case found\n";
  return failed > 0 || passed == 0 ? 1 : 0;
}
