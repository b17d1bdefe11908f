// Mask generators: every kind against a brute-force statement of its meaning,
// document lengths, histogram packs and the histogram reader.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {

// Document index of every token.
std::vector<int> doc_of_tokens(const std::vector<Token>& lengths) {
  std::vector<int> doc;
  for (std::size_t d = 0; d < lengths.size(); ++d) doc.insert(doc.end(), static_cast<std::size_t>(lengths[d]), int(d));
  return doc;
}

std::vector<Token> doc_starts(const std::vector<Token>& lengths) {
  std::vector<Token> start(lengths.size());
  std::exclusive_scan(lengths.begin(), lengths.end(), start.begin(), Token{0});
  return start;
}

using Semantics = std::function<bool(Token i, Token j, Token a, Token n)>;  // i, j relative to doc start a

// Checks every (q, k) entry: covered by exactly one slice when the semantics
// say unmasked, by none otherwise; and the mask's area equals the count.
void check_against_semantics(const MaskSpec& spec, Token S, bool per_document, const Semantics& unmasked) {
  const RangeMask mask = make_mask(spec, S);
  REQUIRE(mask.seqlen() == S);
  const std::vector<Token> lengths = per_document ? document_lengths(spec, S) : std::vector<Token>{S};
  const auto doc = doc_of_tokens(lengths);
  const auto start = doc_starts(lengths);
  Token expected_area = 0;
  for (Token q = 0; q < S; ++q) {
    for (Token k = 0; k < S; ++k) {
      int covered = 0;
      for (const Slice& s : mask.slices()) covered += slice_contains(s, q, k) ? 1 : 0;
      const int dq = doc[std::size_t(q)];
      const bool want = dq == doc[std::size_t(k)] &&
                        unmasked(q - start[std::size_t(dq)], k - start[std::size_t(dq)], start[std::size_t(dq)],
                                 lengths[std::size_t(dq)]);
      expected_area += want ? 1 : 0;
      if (covered != (want ? 1 : 0)) {
        FAIL_CHECK("entry (" << q << ", " << k << ") covered " << covered << " times, expected " << want
                             << " (kind " << to_string(spec.kind) << ")");
        return;
      }
    }
  }
  CHECK(mask.area() == expected_area);
}

const std::vector<Token> kDocs{1, 2, 3, 7, 13, 30};  // S = 56: tiny, odd and larger documents

MaskSpec with_docs(MaskKind kind) {
  MaskSpec spec;
  spec.kind = kind;
  spec.lengths = kDocs;
  return spec;
}

std::filesystem::path bundled_csv() {
  return std::filesystem::path(CPSCHED_SOURCE_DIR) / "configs" / "data" / "doc_length_distribution.csv";
}

std::filesystem::path write_temp(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "cpsched_test_mask_generators";
  std::filesystem::create_directories(dir);
  const auto file = dir / name;
  std::ofstream(file) << text;
  return file;
}


}  // namespace

TEST_CASE("kind names round-trip") {
  for (const std::string& name : mask_kind_names()) {
    MaskKind k{};
    REQUIRE(parse_mask_kind(name, k));
    CHECK(to_string(k) == name);
  }
  MaskKind k{};
  CHECK_FALSE(parse_mask_kind("causal_documents", k));
  CHECK(mask_kind_names().size() == 9);
}

TEST_CASE("full and causal are one slice over the whole sequence, whatever the documents") {
  for (MaskKind kind : {MaskKind::full, MaskKind::causal}) {
    const RangeMask m = make_mask(with_docs(kind), 56);
    REQUIRE(m.slices().size() == 1);
    CHECK(m.slices()[0].q == Range{0, 56});
    CHECK(m.slices()[0].k == Range{0, 56});
  }
  check_against_semantics(with_docs(MaskKind::full), 56, false, [](Token, Token, Token, Token) { return true; });
  check_against_semantics(with_docs(MaskKind::causal), 56, false, [](Token i, Token j, Token, Token) { return j <= i; });
}

TEST_CASE("document kinds: one slice per document, entries only inside documents") {
  const RangeMask full = make_mask(with_docs(MaskKind::full_document), 56);
  CHECK(full.slices().size() == kDocs.size());
  CHECK(full.area() == 1 + 4 + 9 + 49 + 169 + 900);
  check_against_semantics(with_docs(MaskKind::full_document), 56, true, [](Token, Token, Token, Token) { return true; });
  check_against_semantics(with_docs(MaskKind::causal_document), 56, true,
                          [](Token i, Token j, Token, Token) { return j <= i; });
}

TEST_CASE("sliding_window: (i, j) unmasked iff same document and i-left <= j <= i+right") {
  // Windows smaller than, equal to and larger than the documents, with and without a right side.
  for (Token left : {0, 1, 2, 5, 12, 29, 100}) {
    for (Token right : {0, 1, 3, 12, 29, 100}) {
      CAPTURE(left);
      CAPTURE(right);
      MaskSpec spec = with_docs(MaskKind::sliding_window);
      spec.window_left = left;
      spec.window_right = right;
      check_against_semantics(spec, 56, true,
                              [&](Token i, Token j, Token, Token) { return i - left <= j && j <= i + right; });
      // At most three slices per document (rows grouped by clipped window edges).
      CHECK(make_mask(spec, 56).slices().size() <= 3 * kDocs.size());
    }
  }
}

TEST_CASE("sliding_window with an unbounded window degenerates to the plain document masks") {
  MaskSpec spec = with_docs(MaskKind::sliding_window);
  spec.window_left = 1000;
  spec.window_right = 0;
  const RangeMask causal = make_mask(spec, 56);
  CHECK(causal.slices().size() == kDocs.size());
  for (const Slice& s : causal.slices()) CHECK(s.type == MaskType::causal);
  spec.window_right = 1000;
  CHECK(make_mask(spec, 56).slices().size() == kDocs.size());
}

TEST_CASE("prefix_lm: full prefix of round(fraction * len) tokens, causal rest") {
  for (double f : {0.0, 0.3, 0.5, 1.0}) {
    CAPTURE(f);
    MaskSpec spec = with_docs(MaskKind::prefix_lm);
    spec.prefix_fraction = f;
    check_against_semantics(spec, 56, true, [&](Token i, Token j, Token, Token n) {
      const Token p = std::llround(f * double(n));
      return j <= i || (i < p && j < p);
    });
  }
  // Concretely: a 10-token document with fraction 0.34 has a 3-token prefix.
  MaskSpec spec;
  spec.kind = MaskKind::prefix_lm;
  spec.prefix_fraction = 0.34;
  const RangeMask m = make_mask(spec, 10);
  CHECK(m.area() == 9 + (55 - 6));
}

TEST_CASE("share_question: answers see the whole question and themselves, causally") {
  for (int answers : {1, 3, 4, 40}) {
    for (double f : {0.0, 0.25, 0.6}) {
      CAPTURE(answers);
      CAPTURE(f);
      MaskSpec spec = with_docs(MaskKind::share_question);
      spec.question_fraction = f;
      spec.num_answers = answers;
      check_against_semantics(spec, 56, true, [&](Token i, Token j, Token, Token n) {
        const Token q = std::llround(f * double(n));
        if (i < q) return j <= i;  // question: causal
        if (j < q) return true;    // an answer sees the whole question
        // Answers of near-equal length, the first (m mod answers) one token longer.
        const Token m = n - q, base = m / answers, extra = m % answers;
        auto answer_of = [&](Token t) {
          Token s = q;
          for (int a = 0; a < answers; ++a) {
            const Token e = s + base + (a < extra ? 1 : 0);
            if (t < e) return a;
            s = e;
          }
          return -1;
        };
        return answer_of(i) == answer_of(j) && j <= i;
      });
    }
  }
}

TEST_CASE("block_causal_document: a block sees the earlier blocks of its document and itself, fully") {
  for (Token block : {1, 2, 5, 64}) {
    CAPTURE(block);
    MaskSpec spec = with_docs(MaskKind::block_causal_document);
    spec.block_size = block;
    check_against_semantics(spec, 56, true, [&](Token i, Token j, Token, Token) { return j / block <= i / block; });
  }
}

TEST_CASE("slices kind: explicit slices are kept and validated") {
  MaskSpec spec;
  spec.kind = MaskKind::slices;
  spec.slices = {Slice{{0, 8}, {0, 8}, MaskType::causal}, Slice{{8, 16}, {0, 16}, MaskType::full}};
  const RangeMask m = make_mask(spec, 16);
  CHECK(m.slices() == spec.slices);
  CHECK(m.area() == 36 + 128);
  spec.slices.push_back(Slice{{4, 12}, {2, 3}, MaskType::full});  // overlaps both
  CHECK_THROWS_AS(make_mask(spec, 16), Error);
  spec.slices = {Slice{{0, 20}, {0, 8}, MaskType::full}};  // outside S
  CHECK_THROWS_AS(make_mask(spec, 16), Error);
  spec.slices.clear();
  CHECK_THROWS_AS(make_mask(spec, 16), Error);
}

TEST_CASE("document lengths: explicit, one document, and a wrong sum naming both numbers") {
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  CHECK(document_lengths(spec, 100) == std::vector<Token>{100});
  spec.lengths = {60, 40};
  CHECK(document_lengths(spec, 100) == std::vector<Token>{60, 40});
  const std::string msg = error_of([&] { document_lengths(spec, 128); });
  CHECK(msg.find("100") != std::string::npos);
  CHECK(msg.find("128") != std::string::npos);
  CHECK(error_of([&] { make_mask(spec, 128); }) == msg);
  spec.lengths = {100, 0, 28};
  CHECK(error_of([&] { document_lengths(spec, 128); }).find("must be >= 1") != std::string::npos);
}

TEST_CASE("bad generator parameters are rejected with the value") {
  MaskSpec spec = with_docs(MaskKind::sliding_window);
  spec.window_left = -1;
  CHECK(error_of([&] { make_mask(spec, 56); }).find("-1") != std::string::npos);
  spec = with_docs(MaskKind::block_causal_document);
  spec.block_size = 0;
  CHECK(error_of([&] { make_mask(spec, 56); }).find("block_size") != std::string::npos);
  spec = with_docs(MaskKind::share_question);
  spec.num_answers = 0;
  CHECK(error_of([&] { make_mask(spec, 56); }).find("num_answers") != std::string::npos);
  spec = with_docs(MaskKind::prefix_lm);
  spec.prefix_fraction = 1.5;
  CHECK(error_of([&] { make_mask(spec, 56); }).find("prefix_fraction") != std::string::npos);
  CHECK_THROWS_AS(make_mask(MaskSpec{}, 0), Error);
}

TEST_CASE("histogram reader: the bundled CSV") {
  const DocHistogram h = DocHistogram::load_csv(bundled_csv());
  REQUIRE(h.bins.size() == 14);
  CHECK(h.bins[0].lo == 0);
  CHECK(h.bins[0].hi == 10);
  CHECK(h.bins[0].count == 30254);
  CHECK(h.bins[0].representative() == 5);
  CHECK(h.bins[13].lo == 131073);
  CHECK(h.bins[13].hi == 196608);
  CHECK(h.bins[13].count == 18284);
}

TEST_CASE("histogram reader: errors name the file and the line") {
  const std::string header = "range,number,percentage(%),cumulative-percentage(%)\n";
  struct Case {
    const char* name;
    std::string body;
    const char* where;
    const char* what;
  } cases[] = {
      {"count.csv", "\"[0, 10]\",30,0.1,0.1\n\"[11, 50]\",many,1,1\n", ":3:", "many"},
      {"range.csv", "\"[0; 10]\",30,0.1,0.1\n", ":2:", "[0; 10]"},
      {"quote.csv", "\"[0, 10],30\n", ":2:", "unterminated"},
      {"unquoted.csv", "[0 10],30\n", ":2:", "quoted range"},
      {"inverted.csv", "\"[10, 0]\",30\n", "bin 0", "lo <= hi"},
      {"zero.csv", "\"[0, 10]\",0\n", "", "count 0"},
      {"empty.csv", "", "", "no histogram rows"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto file = write_temp(c.name, header + c.body);
    const std::string msg = error_of([&] { DocHistogram::load_csv(file); });
    CHECK(msg.find(file.string()) != std::string::npos);
    CHECK(msg.find(c.where) != std::string::npos);
    CHECK(msg.find(c.what) != std::string::npos);
  }
  CHECK(error_of([] { DocHistogram::load_csv("/nonexistent/h.csv"); }).find("/nonexistent/h.csv") !=
        std::string::npos);
}

TEST_CASE("histogram packs: exactly S tokens, pieces at most S/4, deterministic per seed and pack") {
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  spec.histogram = DocHistogram::load_csv(bundled_csv());
  for (Token S : {Token{64}, Token{1000}, Token{65536}}) {
    for (int pack : {0, 1, 7}) {
      spec.pack = pack;
      const auto lengths = document_lengths(spec, S);
      CHECK(std::accumulate(lengths.begin(), lengths.end(), Token{0}) == S);
      for (Token n : lengths) {
        CHECK(n >= 1);
        CHECK(n <= S / 4);
      }
      CHECK(document_lengths(spec, S) == lengths);
      make_mask(spec, S);  // validates
    }
  }
  spec.pack = 0;
  const auto p0 = document_lengths(spec, 65536);
  spec.pack = 1;
  CHECK(document_lengths(spec, 65536) != p0);
  spec.pack = 0;
  spec.seed = 43;
  CHECK(document_lengths(spec, 65536) != p0);
}

TEST_CASE("histogram packs: the sampling procedure is fixed (golden values, same on every platform)") {
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  spec.histogram = DocHistogram::load_csv(bundled_csv());
  spec.seed = 42;
  const auto p0 = document_lengths(spec, 65536);
  std::string head;
  for (std::size_t i = 0; i < 8 && i < p0.size(); ++i) head += std::to_string(p0[i]) + " ";
  CHECK(p0.size() == 34);
  CHECK(head == "350 75 350 762 762 1536 1536 30 ");
}

TEST_CASE("histogram packs: a piece overflowing a pack is split and carried into the next pack") {
  // Every document has 8 tokens; with S = 36 a pack holds 4.5 documents.
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  spec.histogram.bins = {{8, 8, 5}};
  spec.pack = 0;
  CHECK(document_lengths(spec, 36) == std::vector<Token>{8, 8, 8, 8, 4});
  spec.pack = 1;
  CHECK(document_lengths(spec, 36) == std::vector<Token>{4, 8, 8, 8, 8});
  // Documents longer than S/4 are cut into S/4 pieces: 100 tokens with S = 40 -> pieces of 10.
  spec.histogram.bins = {{100, 100, 1}};
  spec.pack = 3;
  CHECK(document_lengths(spec, 40) == std::vector<Token>{10, 10, 10, 10});
}

TEST_CASE("histogram packs: an invalid histogram is rejected") {
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  spec.histogram.bins = {{0, 0, 5}};  // midpoint 0: documents of no tokens
  CHECK(error_of([&] { document_lengths(spec, 64); }).find("midpoint") != std::string::npos);
  spec.histogram.bins = {{1, 4, 5}};
  spec.pack = -1;
  CHECK_THROWS_AS(document_lengths(spec, 64), Error);
}
