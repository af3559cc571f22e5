// AtomicFile: a committed file holds every byte; an uncommitted one leaves nothing behind; a path
// that cannot be written is refused at once, naming it.

#include "headlight/core/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "headlight/core/error.h"

namespace headlight {
namespace {

namespace fs = std::filesystem;

fs::path fresh_folder(const char* name) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(AtomicFile, CommitWritesEveryByteAndLeavesNoTemporary) {
  const fs::path dir = fresh_folder("headlight_atomic_commit");
  const fs::path path = dir / "out.bin";
  {
    AtomicFile f(path.string());
    f.write("abc");
    const char bytes[3] = {'\0', 'x', '\n'};
    f.write(bytes, 3);
    EXPECT_FALSE(fs::exists(path));  // not there before the commit
    f.commit();
  }
  EXPECT_EQ(read(path), std::string("abc\0x\n", 6));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(AtomicFile, AnUncommittedFileLeavesTheOldOneAndNothingElse) {
  const fs::path dir = fresh_folder("headlight_atomic_abort");
  const fs::path path = dir / "out.txt";
  std::ofstream(path) << "old";
  try {
    AtomicFile f(path.string());
    f.write("half of the new");
    throw std::runtime_error("a later step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read(path), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(AtomicFile, RefusesAFolderOrAMissingFolderNamingThePath) {
  const fs::path dir = fresh_folder("headlight_atomic_refuse");
  try {
    AtomicFile f(dir.string());
    FAIL() << "a folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string() + ": is a folder"), std::string::npos)
        << e.what();
  }
  const std::string missing = (dir / "no" / "such" / "x.bin").string();
  try {
    AtomicFile f(missing);
    FAIL() << "a missing folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace headlight
