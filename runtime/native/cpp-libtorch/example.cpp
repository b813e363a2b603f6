// Load mha.pt with libtorch and run one input (batch 1, 4 tokens, d_in from the embedded config).
#include <torch/script.h>
#include <iostream>

int main(int argc, char** argv) {
  try {  // libtorch reports a missing or corrupt file by throwing: one line, not an abort
    torch::jit::ExtraFilesMap extra{{"config.json", ""}};
    auto module = torch::jit::load(argc > 1 ? argv[1] : "artifacts/seed/mha.pt", torch::kCPU, extra);
    std::cout << "config " << extra["config.json"] << "\n";
    torch::NoGradGuard no_grad;
    auto x = torch::rand({1, 4, 3});                        // [batch, tokens, d_in]
    auto context = module.forward({x}).toTensor();          // [batch, tokens, heads * d_out]
    std::cout << "context " << context.sizes() << "\n" << context[0][0] << "\n";
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << "error: " << what.substr(0, what.find('\n')) << "\n";
    return 1;
  }
}
