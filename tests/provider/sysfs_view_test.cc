// The file-system view of droce0 (providers/sysfs_view.cc) on the default
// loopback link: the device node, the sysfs tree behind ibv_get_sysfs_path,
// the hard-coded /sys/class/infiniband paths, and that everything else is
// left alone. The binary links libdroce.so ahead of libc, so its open, stat
// & co. are droce's, as under LD_PRELOAD.
#include <dirent.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "../integration/rc_to_rts.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

extern "C" const char* ibv_get_sysfs_path(void);
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace {

constexpr char kNode[] = "/dev/infiniband/uverbs-droce0";
constexpr char kIbdev[] = "/sys/class/infiniband/droce0";

// The file's content through open/read, without the trailing newline.
std::string ReadOpen(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return "<open: " + std::string(strerror(errno)) + ">";
  char buf[256];
  const ssize_t n = read(fd, buf, sizeof(buf));
  close(fd);
  if (n <= 0) return "<read>";
  std::string s(buf, static_cast<size_t>(n));
  if (s.back() == '\n') s.pop_back();
  return s;
}

std::string ReadFopen(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) return "<fopen: " + std::string(strerror(errno)) + ">";
  char buf[256] = "";
  const char* got = fgets(buf, sizeof(buf), f);
  fclose(f);
  if (got == nullptr) return "<fgets>";
  std::string s(buf);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string ReadIbvSysfs(const std::string& dir, const std::string& file) {
  char buf[256];
  if (ibv_read_sysfs_file(dir.c_str(), file.c_str(), buf, sizeof(buf)) < 0) return "<ibv_read_sysfs_file>";
  return buf;
}

class SysfsView : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(n, 1);
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
  }
  void TearDown() override {
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
  }
  ibv_context* ctx_ = nullptr;
};

TEST_F(SysfsView, DeviceNodeIsUverbsCharDevice) {
  struct stat st;
  ASSERT_EQ(stat(kNode, &st), 0) << strerror(errno);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  EXPECT_EQ(major(st.st_rdev), 231u);
  EXPECT_EQ(minor(st.st_rdev), 192u);
  ASSERT_EQ(lstat(kNode, &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ASSERT_EQ(fstatat(AT_FDCWD, kNode, &st, 0), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  struct statx sx;
  ASSERT_EQ(statx(AT_FDCWD, kNode, 0, STATX_BASIC_STATS, &sx), 0);
  EXPECT_TRUE(S_ISCHR(sx.stx_mode));
  EXPECT_EQ(sx.stx_rdev_major, 231u);
  EXPECT_EQ(sx.stx_rdev_minor, 192u);
  EXPECT_EQ(access(kNode, R_OK | W_OK), 0);
  EXPECT_EQ(faccessat(AT_FDCWD, kNode, R_OK | W_OK, 0), 0);
  const int fd = open(kNode, O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << strerror(errno);
  close(fd);
  // The directory holding it, whether or not the host has one.
  ASSERT_EQ(stat("/dev/infiniband", &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_F(SysfsView, DeviceBeyondConfigurationIsEnoent) {
  struct stat st;
  errno = 0;
  EXPECT_EQ(stat("/dev/infiniband/uverbs-droce1", &st), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(access("/dev/infiniband/uverbs-droce1", F_OK), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(open("/dev/infiniband/uverbs-droce1", O_RDWR), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(open("/sys/class/infiniband/droce1/node_type", O_RDONLY), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(stat("/sys/class/infiniband_verbs/uverbs-droce1", &st), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(SysfsView, TreeUnderSysfsPathListsDroce0) {
  const std::string root = ibv_get_sysfs_path();
  EXPECT_NE(root, "/sys");
  struct stat st;
  ASSERT_EQ(stat((root + "/class/infiniband").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  for (const std::string& dir : {root + "/class/infiniband", std::string("/sys/class/infiniband")}) {
    DIR* d = opendir(dir.c_str());
    ASSERT_NE(d, nullptr) << dir << ": " << strerror(errno);
    std::set<std::string> names;
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
    EXPECT_TRUE(names.count("droce0")) << dir;
    EXPECT_FALSE(names.count("droce1")) << dir;
  }
  EXPECT_EQ(ReadOpen(root + "/class/infiniband_verbs/uverbs-droce0/ibdev"), "droce0");
  EXPECT_EQ(ReadOpen(root + "/class/infiniband_verbs/uverbs-droce0/dev"), "231:192");
  EXPECT_EQ(ReadOpen("/sys/class/infiniband_verbs/uverbs-droce0/ibdev"), "droce0");
  // The rest of the real sysfs is reachable through the tree.
  ASSERT_EQ(stat((root + "/class/net/lo").c_str(), &st), 0) << strerror(errno);
  ASSERT_EQ(stat((root + "/kernel").c_str(), &st), 0) << strerror(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_F(SysfsView, AttributesAgreeWithVerbs) {
  ibv_device_attr attr;
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  const uint64_t g = be64toh(attr.node_guid);
  char guid[32];
  std::snprintf(guid, sizeof(guid), "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48),
                static_cast<unsigned>(g >> 32) & 0xFFFF, static_cast<unsigned>(g >> 16) & 0xFFFF,
                static_cast<unsigned>(g) & 0xFFFF);
  ibv_gid gid0;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid0), 0);
  std::string gid_text;
  for (int i = 0; i < 16; i += 2) {
    char part[8];
    std::snprintf(part, sizeof(part), "%s%02x%02x", i ? ":" : "", gid0.raw[i], gid0.raw[i + 1]);
    gid_text += part;
  }
  ibv_port_attr port;
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  ASSERT_EQ(port.state, IBV_PORT_ACTIVE);

  const std::string tree_dev = std::string(ibv_get_sysfs_path()) + "/class/infiniband/droce0";
  const std::pair<const char*, std::string> expected[] = {
      {"node_type", "1: CA"},
      {"node_guid", guid},
      {"sys_image_guid", guid},
      {"ports/1/state", "4: ACTIVE"},
      {"ports/1/phys_state", "5: LinkUp"},
      {"ports/1/link_layer", "Ethernet"},
      {"ports/1/gids/0", gid_text},
      {"ports/1/gid_attrs/types/0", "RoCE v2"},
      {"ports/1/pkeys/0", "0xffff"},
  };
  for (const auto& [file, value] : expected) {
    for (const std::string& dir : {tree_dev, std::string(kIbdev)}) {
      const std::string path = dir + "/" + file;
      EXPECT_EQ(ReadOpen(path), value) << path;
      EXPECT_EQ(ReadFopen(path), value) << path;
      EXPECT_EQ(ReadIbvSysfs(dir, file), value) << path;
    }
    std::ifstream in(std::string(kIbdev) + "/" + file);  // C++ streams: fopen/open underneath
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, value) << file;
  }
  // Beyond the GID table, and files droce does not provide.
  EXPECT_EQ(ReadOpen(std::string(kIbdev) + "/ports/1/gids/2").rfind("<open", 0), 0u);
  EXPECT_EQ(ReadOpen(std::string(kIbdev) + "/ports/1/gid_attrs/ndevs/0").rfind("<open", 0), 0u);
}

TEST_F(SysfsView, OtherPathsUntouched) {
  EXPECT_EQ(ReadFopen("/proc/self/status").rfind("Name:", 0), 0u);
  EXPECT_EQ(ReadOpen("/proc/self/status").rfind("Name:", 0), 0u);
  struct stat st;
  ASSERT_EQ(stat("/sys/class/net/lo", &st), 0);
  char link[256];
  const ssize_t n = readlink("/sys/class/net/lo", link, sizeof(link) - 1);
  ASSERT_GT(n, 0);
  link[n] = '\0';
  EXPECT_NE(std::strstr(link, "devices/virtual/net/lo"), nullptr) << link;
  // A name that only starts like droce's, and a real device's path.
  errno = 0;
  EXPECT_EQ(stat("/sys/class/infiniband/droceX/node_type", &st), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(stat("/dev/infiniband/uverbs0x", &st), -1);
  EXPECT_EQ(errno, ENOENT);
  // Relative paths and null: the real function answers.
  EXPECT_EQ(access("does-not-exist/uverbs-droce0", F_OK), -1);
  // Through a pointer without access's nonnull attribute: passing null
  // through the declaration is undefined (UBSan says so), a program may
  // still do it.
  int (*volatile access_fn)(const char*, int) = access;
  EXPECT_EQ(access_fn(nullptr, F_OK), -1);
  EXPECT_EQ(errno, EFAULT);
}

// hw_counters/<name>: every device counter, live. perftest --report-counters
// resolves each path with realpath, opens it once and reads it again after
// lseek(0) at the end of the run; ibv_read_sysfs_file reads a fresh value.
TEST_F(SysfsView, HwCountersAreLive) {
  const std::string dir = std::string(kIbdev) + "/ports/1/hw_counters";
  const std::string tree_dir = std::string(ibv_get_sysfs_path()) + "/class/infiniband/droce0/ports/1/hw_counters";
  // Every counter is listed.
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') names.insert(e->d_name);
  }
  closedir(d);
  for (const char* n : {"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "icrc_err"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_GE(names.size(), 30u);
  const std::string path = dir + "/sent_pkts";
  char* resolved = realpath(path.c_str(), nullptr);
  ASSERT_NE(resolved, nullptr) << strerror(errno);
  EXPECT_EQ(std::string(resolved), path);
  free(resolved);
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto read_fd = [&] {
    char buf[32] = "";
    EXPECT_GT(read(fd, buf, sizeof(buf) - 1), 0);
    EXPECT_EQ(lseek(fd, 0, SEEK_SET), 0);
    return std::strtoull(buf, nullptr, 10);
  };
  const uint64_t before = read_fd();

  // 10 SENDs of 3000 bytes (3 packets each at MTU 1024) between two RC QPs.
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  std::vector<char> buf(1 << 16);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(pd && cq && mr);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* a = ibv_create_qp(pd, &ia);
  ibv_qp* b = ibv_create_qp(pd, &ia);
  ASSERT_TRUE(a && b);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  ASSERT_EQ(RcToRts(a, b->qp_num, gid), nullptr);
  ASSERT_EQ(RcToRts(b, a->qp_num, gid), nullptr);
  for (int i = 0; i < 10; ++i) {
    ibv_sge rs{reinterpret_cast<uint64_t>(buf.data() + 32768), 3000, mr->lkey};
    ibv_recv_wr rw{};
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* rbad;
    ASSERT_EQ(ibv_post_recv(b, &rw, &rbad), 0);
    ibv_sge ss{reinterpret_cast<uint64_t>(buf.data()), 3000, mr->lkey};
    ibv_send_wr sw{};
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.opcode = IBV_WR_SEND;
    sw.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* sbad;
    ASSERT_EQ(ibv_post_send(a, &sw, &sbad), 0);
    int got = 0;
    for (int spins = 0; got < 2 && spins < 10000000; ++spins) {
      ibv_wc wc;
      const int n = ibv_poll_cq(cq, 1, &wc);
      ASSERT_GE(n, 0);
      if (n == 1) {
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
        ++got;
      }
    }
    ASSERT_EQ(got, 2);
  }
  // The same fd, read again after lseek(0), has moved by at least the 30
  // data packets; a new open and ibv_read_sysfs_file (on the /sys path and
  // on the tree's) agree with it, as nothing is sent meanwhile.
  const uint64_t after = read_fd();
  EXPECT_GE(after, before + 30);
  EXPECT_EQ(std::strtoull(ReadOpen(path).c_str(), nullptr, 10), after);
  EXPECT_EQ(std::strtoull(ReadFopen(path).c_str(), nullptr, 10), after);
  EXPECT_EQ(std::strtoull(ReadIbvSysfs(dir, "sent_pkts").c_str(), nullptr, 10), after);
  EXPECT_EQ(std::strtoull(ReadIbvSysfs(tree_dir, "sent_pkts").c_str(), nullptr, 10), after);
  // ConnectX's names read the same counters as rxe's.
  EXPECT_TRUE(names.count("out_of_sequence") && names.count("rx_write_requests"));
  EXPECT_EQ(ReadOpen(dir + "/out_of_sequence"), ReadOpen(dir + "/out_of_seq_request"));
  EXPECT_EQ(ReadOpen(dir + "/local_ack_timeout_err"), ReadOpen(dir + "/completer_retry_err"));
  EXPECT_EQ(close(fd), 0);
  // Read-only, as sysfs's 0444 counters; unknown names do not exist.
  EXPECT_LT(open(path.c_str(), O_WRONLY), 0);
  EXPECT_EQ(errno, EACCES);
  EXPECT_EQ(ReadOpen(dir + "/no_such_counter").rfind("<open", 0), 0u);
  // A counter fd closed behind the provider's back (the raw system call, as
  // fclose or close_range do) and its number reused by a regular file: the
  // file's reads are its own, never a counter's.
  const int stale = open(path.c_str(), O_RDONLY);
  ASSERT_GE(stale, 0);
  ASSERT_EQ(syscall(SYS_close, stale), 0);
  char tmpl[] = "/tmp/droce-hwc-XXXXXX";
  const int file = mkstemp(tmpl);
  ASSERT_EQ(file, stale);  // the lowest free number
  unlink(tmpl);
  ASSERT_EQ(write(file, "hello\n", 6), 6);
  char got[16] = "";
  ASSERT_EQ(pread(file, got, sizeof(got), 0), 6);
  EXPECT_EQ(std::string(got, 6), "hello\n");
  close(file);
  for (ibv_qp* q : {a, b}) EXPECT_EQ(ibv_destroy_qp(q), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// Run by TreeRemovedAtExit in a child process: makes the tree, writes its
// path to the file named by DROCE_SYSFS_TEST_OUT, opens the device node.
TEST(SysfsViewChild, Helper) {
  const char* out = std::getenv("DROCE_SYSFS_TEST_OUT");
  if (out == nullptr) GTEST_SKIP() << "only run by TreeRemovedAtExit";
  const int fd = open(kNode, O_RDWR);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(out) << ibv_get_sysfs_path();
  std::ofstream(out, std::ios::app) << "\n" << ReadOpen(std::string(kIbdev) + "/node_type") << "\n";
}

TEST(SysfsViewChild, TreeRemovedAtExit) {
  char out[] = "/tmp/droce-sysfs-test-XXXXXX";
  const int ofd = mkstemp(out);
  ASSERT_GE(ofd, 0);
  close(ofd);
  // The child's environment is built before fork: the parent has threads.
  std::vector<std::string> env_strings = {std::string("DROCE_SYSFS_TEST_OUT=") + out};
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  char arg0[] = "sysfs_view_test", arg1[] = "--gtest_filter=SysfsViewChild.Helper";
  char* argv[] = {arg0, arg1, nullptr};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execve("/proc/self/exe", argv, env.data());
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(out);
  std::string root, node_type;
  std::getline(in, root);
  std::getline(in, node_type);
  unlink(out);
  EXPECT_NE(root.find("/droce-sysfs-" + std::to_string(pid) + "-"), std::string::npos) << root;
  EXPECT_EQ(node_type, "1: CA");
  struct stat st;
  errno = 0;
  EXPECT_EQ(stat(root.c_str(), &st), -1) << root << " is still there";
  EXPECT_EQ(errno, ENOENT);
}

}  // namespace
