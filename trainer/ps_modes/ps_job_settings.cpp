#include "trainer/ps_modes/ps_job_settings.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.hpp"
#include "trainer/ps_modes/table_text.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;

constexpr std::size_t kSlotFloats = 4;  // claim, digest in three 24-bit parts
// Trainer 0's settings as text: up to 12 KiB (a config's keys take 4 to 5; longer text is cut,
// naming fewer of the keys that differ, while the digests still compare every one).
constexpr std::size_t kTextFloats = 4096;

std::size_t table_size(int trainers) {
  return kSlotFloats * static_cast<std::size_t>(trainers) + kTextFloats;
}
constexpr uint64_t kPartMask = (uint64_t{1} << 24) - 1;

void put_digest(uint64_t digest, float* out) {
  for (std::size_t p = 0; p < 3; ++p) {
    out[p] = static_cast<float>((digest >> (24 * p)) & kPartMask);
  }
}

uint64_t get_digest(const float* in) {
  uint64_t digest = 0;
  for (std::size_t p = 0; p < 3; ++p) {
    digest |= (static_cast<uint64_t>(std::llround(in[p])) & kPartMask) << (24 * p);
  }
  return digest;
}

// `text` in kTextFloats floats, cut to leave the last one 0 (the end).
std::vector<float> text_floats(const std::string& text) {
  std::vector<float> out(kTextFloats, 0.0f);
  put_table_text(text.substr(0, (kTextFloats - 1) * kTextBytesPerFloat), out.data());
  return out;
}

// The table of a job of `trainers`: a table of another size is a trainer 0 of another count.
std::vector<float> read_table(table::server::RemoteHostTier& servers, int trainers,
                              const char* why) {
  std::vector<float> table(table_size(trainers), 0.0f);
  const Status read = servers.dense(DenseAction::kRead, kSettingsTable, &table);
  if (!read.ok() && read.message().find("the request has") != std::string::npos) {
    GPUBOX_FAIL(
        "the trainers of this job were started with different settings: trainers in the "
        "job (PADDLE_TRAINERS_NUM): this trainer has ",
        trainers, ", and trainer 0 another count (the servers' table ", kSettingsTable,
        " is not of this count's size: ", read.message(), ")");
  }
  throw_if_error(read.with_context(std::string("reading the servers' table ") + kSettingsTable +
                                   " (" + why + ")"));
  return table;
}

}  // namespace

Status write_settings_table(table::server::RemoteHostTier& servers, int trainers,
                            const JobSettings& mine) {
  std::vector<float> table(kSlotFloats * static_cast<std::size_t>(trainers), 0.0f);
  const std::vector<float> text = text_floats(encode_settings(mine));
  static_assert(kSlotFloats > 0 && kTextFloats > 1);
  table.insert(table.end(), text.begin(), text.end());
  return servers.dense(DenseAction::kWrite, kSettingsTable, &table)
      .with_context(std::string("writing the servers' table ") + kSettingsTable);
}

void check_settings(table::server::RemoteHostTier& servers, int me, int trainers,
                    const JobSettings& mine,
                    const std::function<void(const std::string&, const std::string&)>& meet) {
  const auto slots = kSlotFloats * static_cast<std::size_t>(trainers);
  (void)read_table(servers, trainers, "written by trainer 0");  // its size: trainer 0's count
  std::vector<float> claim(table_size(trainers), 0.0f);
  float* slot = claim.data() + kSlotFloats * static_cast<std::size_t>(me);
  slot[0] = 1.0f;
  put_digest(settings_digest(mine), slot + 1);
  throw_if_error(servers.dense(DenseAction::kAdd, kSettingsTable, &claim)
                     .with_context(std::string("adding this trainer's claim to the servers' "
                                               "table ") +
                                   kSettingsTable));
  meet("ps/settings", "once every trainer published its settings");
  const std::vector<float> table = read_table(servers, trainers, "every trainer's claim");
  std::string claims;
  for (int w = 0; w < trainers; ++w) {
    const long count = std::lround(table[kSlotFloats * static_cast<std::size_t>(w)]);
    if (count == 1) continue;
    claims += (claims.empty() ? "" : "; ") + std::string("PADDLE_TRAINER_ID=") + std::to_string(w) +
              (count == 0 ? " was given to no trainer"
                          : " was given to " + std::to_string(count) + " trainers");
  }
  GPUBOX_EXPECTS(claims.empty(), "the trainers of this job do not hold one id each: ", claims, " (",
                 trainers,
                 " trainers met, so another id was given twice or none): each "
                 "trainer's files are its id's share, so one share would train twice and another "
                 "never; start trainer i with PADDLE_TRAINER_ID=i");
  const uint64_t first = get_digest(table.data() + 1);
  if (me != 0 && settings_digest(mine) != first) {
    const std::string text = get_table_text(table.data() + slots, table.size() - slots);
    std::string differences = settings_differences(mine, me, decode_settings(text), 0);
    if (differences.empty()) differences = "(trainer 0's settings could not be read back)";
    GPUBOX_FAIL("the trainers of this job were started with different settings: ", differences,
                ": ", kGiveTheSameSettings);
  }
  std::string others;
  for (int w = 1; w < trainers; ++w) {
    if (w == me) continue;
    if (get_digest(table.data() + kSlotFloats * static_cast<std::size_t>(w) + 1) != first) {
      others += (others.empty() ? "" : ", ") + std::to_string(w);
    }
  }
  GPUBOX_EXPECTS(others.empty(),
                 "the trainers of this job were started with different settings: "
                 "trainer(s) ",
                 others, " differ from trainer 0 (each names the keys in its own error): ",
                 kGiveTheSameSettings);
}

}  // namespace gpubox::trainer::ps_modes
