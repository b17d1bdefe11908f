#include "buffers.hpp"

namespace cpsched::gpu {

RemoteShape remote_shape(const PassPlan& plan, const HeadLayout& h) {
  RemoteShape s;
  for (const StageComm& sc : plan.comm.stages) {
    s.qo_rows += sc.num_remote_qo_tokens;
    s.kv_rows += sc.num_remote_kv_tokens;
  }
  // Remote rows hold one group's heads when groups are scheduled apart.
  const int g = h.groups > 1 ? 0 : -1;
  s.q_heads = h.heads(Tensor::q, g);
  s.kv_heads = h.heads(Tensor::k, g);
  return s;
}

std::vector<StageStaging> staging_layout(const PassLists& lists) {
  std::vector<StageStaging> out;
  Bytes at = 0;
  for (const StageLists& st : lists.stages) {
    StageStaging s;
    s.offset = at;
    s.qo_cast = 0;
    s.kv_cast = s.qo_cast + st.qo.cast_send.bytes;
    s.qo_reduce = s.kv_cast + st.kv.cast_send.bytes;
    s.kv_reduce = s.qo_reduce + st.qo.reduce_recv.bytes;
    s.qo_fwd_cast = s.kv_reduce + st.kv.reduce_recv.bytes;
    s.kv_fwd_cast = s.qo_fwd_cast + st.qo_fwd.cast_send.bytes;
    s.qo_fwd_reduce = s.kv_fwd_cast + st.kv_fwd.cast_send.bytes;
    s.kv_fwd_reduce = s.qo_fwd_reduce + st.qo_fwd.reduce_recv.bytes;
    s.bytes = s.kv_fwd_reduce + st.kv_fwd.reduce_recv.bytes;
    at += s.bytes;
    out.push_back(s);
  }
  return out;
}

BufferSizes buffer_sizes(const RankPlan& plan, const PassLists& fwd, const PassLists& bwd, const HeadLayout& h,
                         Token local_rows, Token tail) {
  BufferSizes z;
  LocalBuffers lb;
  visit_local(lb, h, local_rows, [&](const char* name, Bytes n, auto&) {
    z.local.push_back({name, n});
    z.local_bytes += n;
  }, tail);
  const PassLists* lists[2] = {&fwd, &bwd};
  const PassPlan* pp[2] = {&plan.fwd, &plan.bwd};
  for (int p = 0; p < 2; ++p) {
    z.staging[p] = staging_layout(*lists[p]);
    const Bytes staging = z.staging[p].empty() ? 0 : z.staging[p].back().offset + z.staging[p].back().bytes;
    RemoteBuffers rb;
    visit_remote(rb, p == 0 ? Pass::fwd : Pass::bwd, remote_shape(*pp[p], h), h, staging,
                 [&](const char* name, Bytes n, auto&) {
                   z.remote[p].push_back({name, n});
                   z.remote_bytes[p] += n;
                 }, tail);
  }
  return z;
}

}  // namespace cpsched::gpu
