// The corpus replay of a fuzz target (the `<name>_test` of
// memwall_fuzz_test), run by every CI build with the ordinary compiler:
//   1. every input of the checked-in corpus (the seeds, and each past
//      finding once fixed);
//   2. `mutations` deterministic mutations of them (a fixed seed, so a
//      failure reproduces): bit flips, interesting bytes and integers
//      written over the input, deletions, duplications, insertions,
//      truncations and splices of two inputs.
// A crash, a sanitizer report or a broken FUZZ_CHECK fails the test; the
// input that did it is written to the test's undeclared outputs (or /tmp)
// as `fuzz-finding` before the process dies, ready to join the corpus.
//
// Usage: <test> CORPUS_DIR MUTATIONS
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/splitmix.h"
#include "tools/fuzz.h"

namespace {

std::string corpus_dir;
int64_t mutations = 0;

// The input being run, for the crash handler (async-signal-safe: it only
// open()s and write()s).
const std::string* current = nullptr;
char finding_path[4096];

void WriteFinding(int sig) {
  if (current != nullptr) {
    const int fd = ::open(finding_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!::write(fd, current->data(), current->size());
      ::close(fd);
    }
    static const char note[] = "\nfuzz_replay: the input that failed is in ";
    (void)!::write(2, note, sizeof(note) - 1);
    (void)!::write(2, finding_path, std::strlen(finding_path));
    (void)!::write(2, "\n", 1);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void RunOne(const std::string& input) {
  current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  current = nullptr;
}

std::vector<std::string> LoadCorpus() {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir)) {
    if (entry.is_regular_file()) paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());  // a fixed order, so mutations reproduce
  std::vector<std::string> inputs;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    inputs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return inputs;
}

// A small, fixed PRNG (not std:: distributions, whose output differs
// between standard libraries).
struct Rng {
  memwall::SplitMix64Stream stream;
  uint64_t Next() { return stream.Next(); }
  size_t Below(size_t n) { return n == 0 ? 0 : Next() % n; }
};

void Mutate(std::string& s, const std::vector<std::string>& corpus, Rng& rng) {
  static const char kBytes[] = {0, 1, '\x7f', '\x80', '\xff', '"', '\\', '{', '}', '[', ']', ':', ',',
                                '-', '0', '9', 'e', '\n', ' ', '#', '<', '>'};
  static const int64_t kIntegers[] = {0, 1, -1, 255, 256, 65535, 65536, INT32_MAX, INT32_MIN,
                                      int64_t{1} << 32, INT64_MAX, INT64_MIN, int64_t{1} << 62};
  const int ops = 1 + int(rng.Below(4));
  for (int op = 0; op < ops; ++op) {
    const size_t at = rng.Below(s.size() + 1);
    switch (rng.Below(8)) {
      case 0:  // flip a bit
        if (!s.empty()) s[rng.Below(s.size())] ^= char(1 << rng.Below(8));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) s[rng.Below(s.size())] = kBytes[rng.Below(sizeof(kBytes))];
        break;
      case 2: {  // an interesting integer, as 8 little-endian bytes or as text
        const int64_t v = kIntegers[rng.Below(std::size(kIntegers))];
        if (rng.Below(2) == 0 && s.size() >= 8) {
          std::memcpy(s.data() + rng.Below(s.size() - 7), &v, 8);
        } else {
          s.insert(at, std::to_string(v));
        }
        break;
      }
      case 3:  // delete a range
        s.erase(at, 1 + rng.Below(16));
        break;
      case 4: {  // duplicate a range
        if (s.empty()) break;
        const size_t from = rng.Below(s.size());
        s.insert(at, s.substr(from, 1 + rng.Below(32)));
        break;
      }
      case 5: {  // insert random bytes
        std::string bytes(1 + rng.Below(8), '\0');
        for (char& c : bytes) c = char(rng.Next());
        s.insert(at, bytes);
        break;
      }
      case 6:  // truncate
        s.resize(rng.Below(s.size() + 1));
        break;
      case 7: {  // splice: this input's head, another's tail
        const std::string& other = corpus[rng.Below(corpus.size())];
        s = s.substr(0, at) + other.substr(rng.Below(other.size() + 1));
        break;
      }
    }
  }
}

TEST(FuzzReplay, EveryCorpusInput) {
  const std::vector<std::string> corpus = LoadCorpus();
  ASSERT_FALSE(corpus.empty()) << "no corpus in " << corpus_dir;
  for (const std::string& input : corpus) RunOne(input);
  // The empty input and a lone byte are every parser's edge.
  RunOne("");
  RunOne(std::string(1, '\0'));
}

TEST(FuzzReplay, DeterministicMutationsOfTheCorpus) {
  const std::vector<std::string> corpus = LoadCorpus();
  ASSERT_FALSE(corpus.empty()) << "no corpus in " << corpus_dir;
  Rng rng{0x6d656d77616c6cULL};  // "memwall"
  for (int64_t i = 0; i < mutations; ++i) {
    std::string input = corpus[i % corpus.size()];
    Mutate(input, corpus, rng);
    RunOne(input);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR MUTATIONS\n", argv[0]);
    return 2;
  }
  corpus_dir = argv[1];
  mutations = std::atoll(argv[2]);
  const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  std::snprintf(finding_path, sizeof(finding_path), "%s/fuzz-finding", out != nullptr ? out : "/tmp");
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, WriteFinding);
  return RUN_ALL_TESTS();
}
