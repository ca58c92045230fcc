// Loads a TorchScript module saved from Python whose forward(epochs) iterates
// a torch_shards dataset and returns the rows of every epoch, and prints one
// line of rows per epoch.
//
//   load_scripted module.pt 2
#include <torch/script.h>
#include <torch_shards/torch_shards.h>  // keeps the library loaded under --as-needed

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: load_scripted MODULE EPOCHS\n";
    return 2;
  }
  try {
    torch::jit::Module module = torch::jit::load(argv[1]);
    const c10::List<c10::IValue> epochs = module.forward({static_cast<int64_t>(std::stoll(argv[2]))}).toList();
    for (const c10::IValue& epoch : epochs) {
      for (const int64_t row : epoch.toIntList()) std::cout << row << ' ';
      std::cout << '\n';
    }
  } catch (const c10::Error& error) {
    std::cerr << error.msg() << '\n';
    return 1;
  }
  return 0;
}
