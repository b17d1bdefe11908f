#include "emulate.hpp"

#include <exception>
#include <fmt/format.h>
#include <thread>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

void rethrow_first_cause(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      if (std::string(err.what()).find("aborted while receiving") == std::string::npos) throw;
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void run_rank_threads(HostWorld& world, int ranks, const std::function<void(Rank)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  auto fail = [&](Rank r, std::exception_ptr e, const std::string& what) {
    errors[static_cast<std::size_t>(r)] = std::move(e);
    world.abort(fmt::format("rank {} failed: {}", r, what));
  };
  auto run = [&](Rank r) {
    try {
      body(r);
    } catch (const std::exception& e) {
      fail(r, std::current_exception(), e.what());
    } catch (...) {
      fail(r, std::current_exception(), "an exception that is not a std::exception");
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (Rank r = 0; r < ranks; ++r) {
    try {
      threads.emplace_back(run, r);
    } catch (const std::exception& e) {
      const std::string why = fmt::format("cuda_nccl: the thread of rank {} could not start ({})", r, e.what());
      fail(r, std::make_exception_ptr(Error(why)), why);
      break;
    }
  }
  for (auto& t : threads) t.join();
  rethrow_first_cause(errors);
}

EmulatedRun emulate(const Plan& plan, const HeadLayout& h, const std::vector<RankInputs>& inputs, Schedule schedule,
                    const PipelineOptions& opt) {
  const int P = static_cast<int>(plan.ranks.size());
  if (static_cast<int>(inputs.size()) != P || plan.sharding.cp_size != P)
    throw Error(fmt::format("cuda_nccl emulation: {} rank plans, {} input shards, sharding over {} ranks", P,
                            inputs.size(), plan.sharding.cp_size));
  HostWorld world(P);
  EmulatedRun run;
  run.outputs.resize(static_cast<std::size_t>(P));
  std::vector<std::int64_t> kernels(static_cast<std::size_t>(P), 0);
  std::vector<RouteSummary> routes(2 * static_cast<std::size_t>(P));
  run_rank_threads(world, P, [&](Rank r) {
    const auto i = static_cast<std::size_t>(r);
    HostBackend be(world, r, schedule);
    RankPipeline pipe(be, plan.ranks[i], h, plan.sharding.rank_tokens(r).size(), opt);
    routes[2 * i] = pipe.sdpa(Pass::fwd).routes.summary;
    routes[2 * i + 1] = pipe.sdpa(Pass::bwd).routes.summary;
    pipe.set_inputs(inputs[i]);
    pipe.forward();
    pipe.backward();
    pipe.synchronize();
    run.outputs[i] = pipe.outputs();
    kernels[i] = be.kernels_run();
  });
  for (std::int64_t k : kernels) run.kernels += k;
  for (std::size_t i = 0; i < routes.size(); ++i) run.routes[i % 2].add(routes[i]);
  return run;
}

}  // namespace cpsched::gpu
