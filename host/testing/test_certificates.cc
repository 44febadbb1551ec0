#include "host/testing/test_certificates.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"

extern char** environ;

namespace cloister::host::testing {
namespace {

// Runs `openssl ARGS` in `dir` with stdout and stderr captured; Internal with that output when
// it fails.
absl::Status OpenSsl(const std::vector<std::string>& args, const std::string& dir) {
  std::string log_path = absl::StrCat(dir, "/openssl.log");
  std::vector<std::string> argv_strings = {"openssl"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid;
  int spawned = posix_spawnp(&pid, "openssl", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return absl::NotFoundError("openssl is not on PATH");
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    absl::StatusOr<std::string> output = ReadFile(log_path, 1 << 16);
    return absl::InternalError(absl::StrCat(
        "openssl ", args[0], " failed: ", output.ok() ? *output : std::string("(no output)")));
  }
  return absl::OkStatus();
}

// A P-256 key and a CSR for `subject`, then a certificate signed by `ca` with `extensions`.
absl::Status IssueCertificate(const std::string& dir, const std::string& name,
                              const std::string& subject, const std::string& ca,
                              const std::string& extensions) {
  RETURN_IF_ERROR(WriteFileAtomic(absl::StrCat(dir, "/", name, ".ext"), extensions, 0600));
  RETURN_IF_ERROR(
      OpenSsl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
               "-keyout", name + ".key", "-out", name + ".csr", "-subj", subject},
              dir));
  return OpenSsl({"x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
                  "-CAcreateserial", "-days", "2", "-sha256", "-extfile", name + ".ext", "-out",
                  name + ".crt"},
                 dir);
}

absl::Status MakeCa(const std::string& dir, const std::string& name, const std::string& subject) {
  return OpenSsl({"req",         "-x509",
                  "-newkey",     "ec",
                  "-pkeyopt",    "ec_paramgen_curve:P-256",
                  "-nodes",      "-keyout",
                  name + ".key", "-out",
                  name + ".crt", "-days",
                  "2",           "-sha256",
                  "-subj",       subject,
                  "-addext",     "basicConstraints=critical,CA:TRUE",
                  "-addext",     "keyUsage=critical,keyCertSign,cRLSign"},
                 dir);
}

}  // namespace

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  RETURN_IF_ERROR(MakeCa(dir, "ca", "/CN=Cloister Test CA"));
  RETURN_IF_ERROR(MakeCa(dir, "rogue-ca", "/CN=Rogue Test CA"));
  constexpr char kLeaf[] = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n";
  RETURN_IF_ERROR(IssueCertificate(
      dir, "server", "/CN=localhost", "ca",
      absl::StrCat(kLeaf,
                   "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")));
  RETURN_IF_ERROR(IssueCertificate(
      dir, "client", "/CN=acme-client", "ca",
      absl::StrCat(
          kLeaf,
          "extendedKeyUsage=clientAuth\nsubjectAltName=URI:spiffe://cloister.test/tenant/acme\n")));
  RETURN_IF_ERROR(IssueCertificate(dir, "other-client", "/CN=globex-client", "ca",
                                   absl::StrCat(kLeaf, "extendedKeyUsage=clientAuth\n")));
  RETURN_IF_ERROR(IssueCertificate(dir, "rogue-client", "/CN=acme-client", "rogue-ca",
                                   absl::StrCat(kLeaf, "extendedKeyUsage=clientAuth\n")));
  auto path = [&dir](const char* name) { return absl::StrCat(dir, "/", name); };
  return TestCertificates{
      .ca_cert = path("ca.crt"),
      .server_cert = path("server.crt"),
      .server_key = path("server.key"),
      .client_cert = path("client.crt"),
      .client_key = path("client.key"),
      .other_client_cert = path("other-client.crt"),
      .other_client_key = path("other-client.key"),
      .rogue_client_cert = path("rogue-client.crt"),
      .rogue_client_key = path("rogue-client.key"),
  };
}

}  // namespace cloister::host::testing
