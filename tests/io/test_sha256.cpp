// SHA-256 against the FIPS 180-4 / NIST example digests.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "ratekv/common/error.h"
#include "ratekv/io/sha256.h"

namespace {

std::string hex_of(const std::string& s) {
  return ratekv::sha256_hex({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

TEST(Sha256, NistExamples) {
  EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: padding spills into a second block.
  EXPECT_EQ(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, FileMatchesMemoryAcrossReadBoundary) {
  // 1 MiB + 97 bytes: crosses the file reader's 1 MiB piece size.
  std::string s((1 << 20) + 97, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xff);
  const auto path = std::filesystem::temp_directory_path() / "ratekv_sha256_test.bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(s.data(), 1, s.size(), f);
  std::fclose(f);
  EXPECT_EQ(ratekv::sha256_file(path.string()), hex_of(s));
  std::filesystem::remove(path);
  EXPECT_THROW(ratekv::sha256_file(path.string()), ratekv::Error);
}

}  // namespace
