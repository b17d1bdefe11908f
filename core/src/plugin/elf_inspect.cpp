// Plugin file checks before dlopen and the loaded image's address ranges
// (a truncated plugin mapped into memory kills the process with SIGBUS).
#include "plugin/elf_inspect.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "cpsched/base/error.hpp"

namespace cpsched::detail {

namespace {

using Ehdr = ElfW(Ehdr);
using Phdr = ElfW(Phdr);
using Shdr = ElfW(Shdr);
using Sym = ElfW(Sym);

constexpr unsigned char kHostClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kHostData =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
#if defined(__x86_64__)
constexpr int kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kHostMachine = EM_AARCH64;
#elif defined(__i386__)
constexpr int kHostMachine = EM_386;
#elif defined(__powerpc64__)
constexpr int kHostMachine = EM_PPC64;
#elif defined(__riscv)
constexpr int kHostMachine = EM_RISCV;
#else
constexpr int kHostMachine = -1;  // not checked
#endif

class File {
 public:
  File(const std::filesystem::path& path, const std::string& where) : where_(where) {
    // O_NONBLOCK: a FIFO named like a plugin must not hang the scan.
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd_ < 0) fail("cannot be opened: " + std::string(std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("cannot be inspected: " + std::string(std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) fail("not a regular file");
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  std::uint64_t size() const { return size_; }

  // [offset, offset + n) lies inside the file (overflow-safe).
  bool inside(std::uint64_t offset, std::uint64_t n) const { return offset <= size_ && n <= size_ - offset; }

  // Reads exactly n bytes at offset; the caller proved the range inside.
  void read(std::uint64_t offset, void* out, std::size_t n) const {
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail("cannot be read at byte " + std::to_string(offset) + ": " +
                         (got < 0 ? std::string(std::strerror(errno)) : "the file shrank while being read"));
      p += got;
      offset += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
  }

  [[noreturn]] void fail(const std::string& why) const { throw Error(where_ + ": " + why); }

 private:
  std::string where_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

std::string span(std::uint64_t offset, std::uint64_t n) {
  // n may be huge in a damaged header: say it without wrapping around.
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  std::string out = "[";
  out += std::to_string(offset);
  out += ", ";
  out += n > max - offset ? std::string("2^64+") : std::to_string(offset + n);
  out += ')';
  return out;
}

// Table of `count` entries of `entsize` bytes at `offset`, inside the file.
void check_table(const File& f, const char* what, std::uint64_t offset, std::uint64_t count, std::uint64_t entsize) {
  if (entsize != 0 && count > std::numeric_limits<std::uint64_t>::max() / entsize) {
    f.fail(std::string("is damaged: its ") + what + " has " + std::to_string(count) + " entries");
  }
  if (!f.inside(offset, count * entsize)) {
    f.fail(std::string("is truncated or damaged: its ") + what + " (bytes " + span(offset, count * entsize) +
           ") lies beyond its size of " + std::to_string(f.size()) + " bytes");
  }
}

}  // namespace

void inspect_plugin_file(const std::filesystem::path& path, const std::string& where, std::string_view symbol) {
  const File f(path, where);
  unsigned char ident[EI_NIDENT] = {};
  if (f.size() < EI_NIDENT) {
    f.fail("is not an ELF shared object: invalid ELF header (the file has only " + std::to_string(f.size()) +
           " bytes)");
  }
  f.read(0, ident, EI_NIDENT);
  if (std::memcmp(ident, ELFMAG, SELFMAG) != 0) {
    f.fail("is not an ELF shared object: invalid ELF header (no ELF magic number)");
  }
  if (ident[EI_CLASS] != kHostClass) {
    const char* got = ident[EI_CLASS] == ELFCLASS32 ? "32-bit" : ident[EI_CLASS] == ELFCLASS64 ? "64-bit" : "unknown-class";
    std::string why = "is a ";
    why += got;
    why += " ELF file; this host loads ";
    why += kHostClass == ELFCLASS64 ? "64-bit" : "32-bit";
    why += " plugins";
    f.fail(why);
  }
  if (ident[EI_DATA] != kHostData) f.fail("is an ELF file of the other byte order than this host");
  if (ident[EI_VERSION] != EV_CURRENT) f.fail("has an unknown ELF version " + std::to_string(ident[EI_VERSION]));
  if (f.size() < sizeof(Ehdr)) {
    f.fail("is truncated: " + std::to_string(f.size()) + " bytes, less than an ELF header");
  }
  Ehdr eh{};
  f.read(0, &eh, sizeof eh);
  if (eh.e_type != ET_DYN) f.fail("is not a shared object (ELF type " + std::to_string(eh.e_type) + ")");
  if (kHostMachine >= 0 && eh.e_machine != kHostMachine) {
    f.fail("is built for ELF machine " + std::to_string(eh.e_machine) + ", not this host's " +
           std::to_string(kHostMachine));
  }

  // Section 0 holds the real counts when they do not fit the header (ELF
  // extended numbering).
  std::uint64_t shnum = eh.e_shnum;
  std::uint64_t phnum = eh.e_phnum;
  Shdr sh0{};
  if (eh.e_shoff != 0) {
    if (eh.e_shentsize != sizeof(Shdr)) f.fail("has section headers of " + std::to_string(eh.e_shentsize) + " bytes");
    check_table(f, "section header table", eh.e_shoff, 1, sizeof(Shdr));
    f.read(eh.e_shoff, &sh0, sizeof sh0);
    if (shnum == 0) shnum = sh0.sh_size;
    if (phnum == PN_XNUM) phnum = sh0.sh_info;
  }
  if (phnum == 0) f.fail("has no program headers: it cannot be loaded");
  if (eh.e_phentsize != sizeof(Phdr)) f.fail("has program headers of " + std::to_string(eh.e_phentsize) + " bytes");
  check_table(f, "program header table", eh.e_phoff, phnum, sizeof(Phdr));
  bool dynamic = false;
  for (std::uint64_t i = 0; i < phnum; ++i) {
    Phdr ph{};
    f.read(eh.e_phoff + i * sizeof(Phdr), &ph, sizeof ph);
    if (ph.p_type == PT_DYNAMIC) dynamic = true;
    if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC) continue;
    // What dlopen maps: reading a mapped page beyond the end of the file is SIGBUS.
    if (!f.inside(ph.p_offset, ph.p_filesz)) {
      f.fail("is truncated or damaged: segment #" + std::to_string(i) + " (file bytes " +
             span(ph.p_offset, ph.p_filesz) + ") lies beyond its size of " + std::to_string(f.size()) + " bytes");
    }
    if (ph.p_type == PT_LOAD && ph.p_filesz > ph.p_memsz) {
      f.fail("is damaged: segment #" + std::to_string(i) + " has more file bytes than memory bytes");
    }
  }
  if (!dynamic) f.fail("has no dynamic segment: it is not a shared library");
  if (eh.e_shoff == 0 || shnum == 0) {
    f.fail("has no section headers, so its exported symbols cannot be checked before loading");
  }
  check_table(f, "section header table", eh.e_shoff, shnum, sizeof(Shdr));

  // Every section with file contents inside the file; find .dynsym.
  Shdr dynsym{};
  bool have_dynsym = false;
  for (std::uint64_t i = 1; i < shnum; ++i) {
    Shdr sh{};
    f.read(eh.e_shoff + i * sizeof(Shdr), &sh, sizeof sh);
    if (sh.sh_type != SHT_NOBITS && !f.inside(sh.sh_offset, sh.sh_size)) {
      f.fail("is truncated or damaged: section #" + std::to_string(i) + " (file bytes " +
             span(sh.sh_offset, sh.sh_size) + ") lies beyond its size of " + std::to_string(f.size()) + " bytes");
    }
    if (sh.sh_type == SHT_DYNSYM && !have_dynsym) {
      dynsym = sh;
      have_dynsym = true;
    }
  }
  const std::string no_symbol = "exports no '" + std::string(symbol) +
                                "' (not a cpsched plugin? define it with CPSCHED_SOLVER_PLUGIN or a sibling macro)";
  if (!have_dynsym) f.fail(no_symbol + "; it has no dynamic symbol table");
  if (dynsym.sh_entsize != sizeof(Sym)) f.fail("has dynamic symbols of " + std::to_string(dynsym.sh_entsize) + " bytes");
  if (dynsym.sh_link == 0 || dynsym.sh_link >= shnum) f.fail("is damaged: its dynamic symbol table has no string table");
  Shdr strtab{};
  f.read(eh.e_shoff + std::uint64_t{dynsym.sh_link} * sizeof(Shdr), &strtab, sizeof strtab);
  if (strtab.sh_type != SHT_STRTAB) f.fail("is damaged: its dynamic symbol names are not a string table");

  // Symbols in chunks, names compared with one bounded read each: memory
  // stays small however large the table.
  const std::uint64_t count = dynsym.sh_size / sizeof(Sym);
  std::vector<Sym> chunk(256);
  std::string name(symbol.size() + 1, '\0');
  for (std::uint64_t first = 0; first < count; first += chunk.size()) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), count - first));
    f.read(dynsym.sh_offset + first * sizeof(Sym), chunk.data(), n * sizeof(Sym));
    for (std::size_t i = 0; i < n; ++i) {
      const Sym& s = chunk[i];
      if (s.st_shndx == SHN_UNDEF) continue;
      const unsigned bind = ELF64_ST_BIND(s.st_info);
      if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) continue;
      if (s.st_name >= strtab.sh_size || strtab.sh_size - s.st_name < name.size()) continue;
      f.read(strtab.sh_offset + s.st_name, name.data(), name.size());
      if (name.back() == '\0' && std::string_view(name.data(), symbol.size()) == symbol) return;
    }
  }
  f.fail(no_symbol);
}

LoadedImage LoadedImage::of(void* handle) {
  LoadedImage image;
  link_map* lm = nullptr;
  if (handle == nullptr || ::dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || lm == nullptr) return image;
  struct Search {
    const link_map* lm;
    LoadedImage* image;
  } search{lm, &image};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const char* want = s->lm->l_name != nullptr ? s->lm->l_name : "";
        if (info->dlpi_addr != s->lm->l_addr || std::strcmp(name, want) != 0) return 0;
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          const Phdr& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || ph.p_memsz == 0) continue;
          Span sp;
          sp.begin = info->dlpi_addr + ph.p_vaddr;
          sp.end = sp.begin + ph.p_memsz;
          sp.read = (ph.p_flags & PF_R) != 0;
          sp.exec = (ph.p_flags & PF_X) != 0;
          s->image->spans_.push_back(sp);
        }
        return 1;
      },
      &search);
  return image;
}

std::size_t LoadedImage::room(const void* p) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (const Span& s : spans_) {
    if (s.read && a >= s.begin && a < s.end) return static_cast<std::size_t>(s.end - a);
  }
  return 0;
}

bool LoadedImage::holds_code(const void* p) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (const Span& s : spans_) {
    if (s.exec && a >= s.begin && a < s.end) return true;
  }
  return false;
}

}  // namespace cpsched::detail
