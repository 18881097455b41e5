// The emulated GPU's diagnostics (device_stats.h). tf_metal_ops.emulated_gpu.device_stats() and the tests read the
// JSON keys by name.
#include "device_stats.h"

#include <stdio.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device_memory.h"
#include "streams.h"

namespace {

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace

TFMO_EMU_DEVICE_EXPORT const char* tfmo_emu_device_stats(void) {
  static thread_local std::string out;
  const tfmo_emu::MemoryStats m = tfmo_emu::GetMemoryStats();
  std::vector<std::shared_ptr<TfmoEmuStream>> streams;
  std::string s = "{";
  auto num = [&](const char* k, uint64_t v) { s += "\"" + std::string(k) + "\": " + std::to_string(v) + ", "; };
  num("live_allocations", m.live_allocs);
  num("live_bytes", m.live_bytes);
  num("held_bytes", m.held_bytes);
  num("peak_held_bytes", m.peak_held_bytes);
  num("total_allocations", m.total_allocs);
  num("total_allocated_bytes", m.total_alloc_bytes);
  num("failed_allocations", m.failed_allocs);
  num("bad_frees", m.bad_frees);
  num("deferred_frees_pending", m.pending_frees);
  num("frees_completed", m.deferred_frees);
  num("pending_work_items", m.pending_work_items);
  {
    tfmo_emu::StreamRegistry& r = tfmo_emu::Registry();
    std::lock_guard<std::mutex> l(r.mu);
    streams = r.streams;
    num("host_callback_errors", r.host_callback_errors);
    num("reentrant_queue_syncs", r.reentrant_queue_syncs);
    num("memory_limit_bytes", m.limit);
    num("reserved_address_bytes", m.reserve_size);
    num("reserved_address_base", m.reserve_base);
    num("destroyed_streams_items_run", r.destroyed_streams.items_run);
    num("destroyed_streams_work_items", r.destroyed_streams.work_items);
    num("destroyed_streams_failures", r.destroyed_streams.item_failures + r.destroyed_streams.work_failures);
  }
  s += "\"streams\": [";
  bool first = true;
  for (auto& st : streams) {
    std::lock_guard<std::mutex> l(st->mu);
    if (!first) s += ", ";
    first = false;
    s += "{\"id\": " + std::to_string(st->id) + ", \"enqueued\": " + std::to_string(st->enqueued) +
         ", \"completed\": " + std::to_string(st->completed) + ", \"items_run\": " + std::to_string(st->stats.items_run) +
         ", \"item_failures\": " + std::to_string(st->stats.item_failures) +
         ", \"command_buffers\": " + std::to_string(st->stats.command_buffers) +
         ", \"work_items_run\": " + std::to_string(st->stats.work_items) +
         ", \"work_failures\": " + std::to_string(st->stats.work_failures) +
         ", \"queue_syncs\": " + std::to_string(st->stats.queue_syncs) +
         ", \"open_command_buffer_items\": " + std::to_string(st->open_cb ? st->open_cb->works.size() : 0) +
         ", \"error\": " + (st->failed ? "\"" + JsonEscape(st->error) + "\"" : std::string("null")) + "}";
  }
  s += "]}";
  out = s;
  return out.c_str();
}

TFMO_EMU_DEVICE_EXPORT void tfmo_emu_device_synchronize(void) { tfmo_emu::SynchronizeAllStreams(); }

TFMO_EMU_DEVICE_EXPORT int64_t tfmo_emu_device_check_leaks(void) {
  tfmo_emu::SynchronizeAllStreams();
  return tfmo_emu::ReportUnfreed(20);
}
