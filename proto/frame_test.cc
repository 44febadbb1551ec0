#include "proto/frame.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "cloister/boundary/v1/boundary.pb.h"
#include "gtest/gtest.h"

namespace cloister::boundary {
namespace {

// Both ends of a stream socket pair (or a pipe), closed at the end of the test.
struct Ends {
  int write_end = -1;
  int read_end = -1;
  ~Ends() {
    if (write_end >= 0) ::close(write_end);
    if (read_end >= 0) ::close(read_end);
  }
  void CloseWriter() {
    ::close(write_end);
    write_end = -1;
  }
};

void SocketPair(Ends& ends) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ends.write_end = fds[0];
  ends.read_end = fds[1];
}

std::string Pattern(size_t size, char seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(seed + i * 131 + (i >> 12));
  return bytes;
}

// Writes `frames` from a thread (a large frame fills the socket buffer and goes out in several
// partial writes) while this thread reads them back into one reused buffer.
void RoundTrip(const std::vector<std::string>& frames, Ends& ends) {
  std::thread writer([&] {
    for (const std::string& frame : frames) ASSERT_TRUE(WriteFrame(ends.write_end, frame).ok());
    ends.CloseWriter();
  });
  std::string buffer;
  for (const std::string& expected : frames) {
    absl::StatusOr<absl::string_view> got = ReadFrameInto(ends.read_end, buffer);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->size(), expected.size());
    EXPECT_TRUE(*got == expected) << "frame of " << expected.size() << " bytes differs";
  }
  absl::StatusOr<absl::string_view> end = ReadFrameInto(ends.read_end, buffer);
  EXPECT_EQ(end.status().code(), absl::StatusCode::kOutOfRange) << end.status();
  writer.join();
}

TEST(FrameTest, FramesOfEverySizeRoundTripThroughASocket) {
  Ends ends;
  SocketPair(ends);
  RoundTrip({Pattern(0, 1), Pattern(1, 2), Pattern(3 << 20, 3), Pattern(17, 4),
             Pattern(5 << 20, 5), Pattern(0, 6)},
            ends);
}

TEST(FrameTest, FramesRoundTripThroughAPipe) {
  // Not a socket: the gather write falls back from sendmsg to writev.
  Ends ends;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ends.read_end = fds[0];
  ends.write_end = fds[1];
  RoundTrip({Pattern(10, 1), Pattern(2 << 20, 2)}, ends);
}

// A message written with WriteMessageFrame reads back as the same bytes SerializeAsString gives:
// small fields, large aliased fields (a 3 MiB ciphertext), fields just over the output buffer,
// and more pieces than one gather write may carry (IOV_MAX).
TEST(FrameTest, MessageFramesCarryTheSerializationWithoutCopyingLargeFields) {
  boundary::v1::HostToEnclave call;
  call.set_call_id(42);
  auto* batch = call.mutable_infer_batch();
  batch->set_tenant_id("alpha");
  batch->set_model_handle(std::string(64, 'h'));
  const std::vector<size_t> sizes = {0, 15, 4095, 4097, 3 << 20, 100};
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto* item = batch->add_items();
    item->set_request_id("r" + std::to_string(i));
    item->set_sequence(i + 1);
    item->set_ciphertext(Pattern(sizes[i], static_cast<char>(i)));
  }
  boundary::v1::HostToEnclave many;
  for (int i = 0; i < 1500; ++i) {
    many.mutable_infer_batch()->add_items()->set_ciphertext(Pattern(5000, static_cast<char>(i)));
  }
  boundary::v1::HostToEnclave empty;

  Ends ends;
  SocketPair(ends);
  std::thread writer([&] {
    for (const auto* message : {&call, &many, &empty}) {
      absl::Status written = WriteMessageFrame(ends.write_end, *message);
      ASSERT_TRUE(written.ok()) << written;
    }
    ends.CloseWriter();
  });
  for (const auto* message : {&call, &many, &empty}) {
    absl::StatusOr<std::string> got = ReadFrame(ends.read_end);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == message->SerializeAsString())
        << "a frame of " << got->size() << " bytes differs";
  }
  EXPECT_EQ(ReadFrame(ends.read_end).status().code(), absl::StatusCode::kOutOfRange);
  writer.join();
}

TEST(FrameTest, TheReadBufferIsReusedAndGivenBackAfterAHugeFrame) {
  Ends ends;
  SocketPair(ends);
  const std::string big = Pattern(kFrameBufferKeepLimit + 1, 7);
  std::thread writer([&] {
    for (size_t size : {size_t{2} << 20, size_t{1} << 20, size_t{2} << 20}) {
      ASSERT_TRUE(WriteFrame(ends.write_end, Pattern(size, 1)).ok());
    }
    ASSERT_TRUE(WriteFrame(ends.write_end, big).ok());
    ASSERT_TRUE(WriteFrame(ends.write_end, Pattern(100, 2)).ok());
  });
  std::string buffer;
  ASSERT_TRUE(ReadFrameInto(ends.read_end, buffer).ok());
  const char* first = buffer.data();
  absl::StatusOr<absl::string_view> smaller = ReadFrameInto(ends.read_end, buffer);
  ASSERT_TRUE(smaller.ok());
  EXPECT_EQ(smaller->size(), size_t{1} << 20);
  absl::StatusOr<absl::string_view> again = ReadFrameInto(ends.read_end, buffer);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first) << "frames of the same size did not reuse the buffer";
  absl::StatusOr<absl::string_view> huge = ReadFrameInto(ends.read_end, buffer);
  ASSERT_TRUE(huge.ok());
  EXPECT_TRUE(*huge == big);
  absl::StatusOr<absl::string_view> small = ReadFrameInto(ends.read_end, buffer);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(*small, Pattern(100, 2));
  EXPECT_LE(buffer.size(), kFrameBufferKeepLimit) << "the huge frame's buffer was kept";
  writer.join();
}

TEST(FrameTest, TruncatedAndOversizedFramesAreRefused) {
  {
    Ends ends;
    SocketPair(ends);
    ASSERT_EQ(::write(ends.write_end, "\x05\x00", 2), 2);
    ends.CloseWriter();
    absl::StatusOr<std::string> frame = ReadFrame(ends.read_end);
    EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(frame.status().message(), "truncated boundary frame header");
  }
  {
    Ends ends;
    SocketPair(ends);
    ASSERT_EQ(::write(ends.write_end, "\x05\x00\x00\x00" "abc", 7), 7);
    ends.CloseWriter();
    absl::StatusOr<std::string> frame = ReadFrame(ends.read_end);
    EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(frame.status().message(), "truncated boundary frame");
  }
  {
    Ends ends;
    SocketPair(ends);
    ASSERT_EQ(::write(ends.write_end, "\x00\x00\x10\x00", 4), 4);  // 1 MiB
    absl::StatusOr<std::string> frame = ReadFrame(ends.read_end, /*max_size=*/1000);
    EXPECT_EQ(frame.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(frame.status().message(), "boundary frame of 1048576 bytes exceeds the limit of 1000");
  }
  {
    Ends ends;
    SocketPair(ends);
    ::close(ends.read_end);
    ends.read_end = -1;
    absl::Status status = WriteFrame(ends.write_end, "gone");
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
}

}  // namespace
}  // namespace cloister::boundary
