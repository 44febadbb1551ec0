// cloister-verify: offline attestation verification (attest/cli/verify_cli.h).
#include <iostream>
#include <string>
#include <vector>

#include "attest/cli/verify_cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return cloister::attest::RunVerifyCli(args, std::cout, std::cerr);
}
