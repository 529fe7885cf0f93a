// gpubox._core.train: gpubox_train --mode train (trainer/main/run_job.hpp) with the GIL
// released while the engine runs. The run's hooks (epoch_loop.hpp) take the GIL back at pass
// and epoch boundaries, and for the progress callback: to call the caller's callbacks, and to
// run Python's signal handlers. Ctrl-C sets the run's stop flag (sigint_stop.hpp), which the
// cards vote into their next step's all-reduce: the run stops between two steps, the stopped
// pass unsaved (the last complete save left intact), and KeyboardInterrupt is raised.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <new>
#include <optional>

#include "bindings.hpp"
#include "common/config/memory_asks.hpp"
#include "common/error.hpp"
#include "common/error_report.hpp"
#include "common/logging.hpp"
#include "sigint_stop.hpp"
#include "trainer/main/run_job.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace py = pybind11;

namespace gpubox::python {
namespace {

py::dict metrics_dict(const trainer::MetricValues& m) {
  py::dict d;
  d["examples"] = m.examples;
  d["positives"] = m.positives;
  d["auc"] = m.auc;
  d["logloss"] = m.logloss;
  d["ne"] = m.ne;
  d["actual_ctr"] = m.actual_ctr;
  d["predicted_ctr"] = m.predicted_ctr;
  d["copc"] = m.copc;
  d["mae"] = m.mae;
  d["rmse"] = m.rmse;
  return d;
}

py::dict pass_dict(const trainer::PassReport& report) {
  py::dict d;
  d["pass"] = report.pass;
  d["seconds"] = report.seconds;
  d["cards"] = report.cards;
  d["metrics"] = metrics_dict(report.metrics);
  py::dict extra;
  for (const auto& [name, value] : report.extra) extra[py::str(name)] = value;
  d["extra"] = extra;
  return d;
}

// What the hooks collect while the GIL is released; every py:: object in it is touched only
// with the GIL held (the hooks take it).
struct RunState {
  py::object on_pass;
  py::object on_epoch;
  py::object on_progress;
  py::list passes;
  py::list epochs;
  std::optional<py::error_already_set> pending;  // a callback's exception, or KeyboardInterrupt
  std::atomic<bool> stop{false};                 // StepHooks::stop_flag: Ctrl-C, or `pending`

  // Runs `call` with the GIL; a Python exception in it is kept and stops the run (between two
  // steps when it came from the progress callback).
  template <class Call>
  void guarded(Call&& call) {
    py::gil_scoped_acquire gil;
    if (pending) return;
    try {
      call();
    } catch (py::error_already_set& e) {
      pending = std::move(e);
      stop.store(true);
    }
  }
};

trainer::RunHooks hooks_for(RunState& state) {
  trainer::RunHooks hooks;
  hooks.on_pass = [&state](const trainer::PassReport& report) {
    state.guarded([&] {
      py::dict d = pass_dict(report);
      state.passes.append(d);
      if (!state.on_pass.is_none()) state.on_pass(d);
    });
  };
  hooks.on_epoch = [&state](int64_t epoch, const trainer::MetricValues& train,
                            const trainer::MetricValues* test) {
    state.guarded([&] {
      py::dict d;
      d["epoch"] = epoch;
      d["train"] = metrics_dict(train);
      d["test"] = test ? py::object(metrics_dict(*test)) : py::object(py::none());
      state.epochs.append(d);
      if (!state.on_epoch.is_none()) state.on_epoch(d);
    });
  };
  hooks.stop_requested = [&state] {
    py::gil_scoped_acquire gil;
    // Python's handlers (a caller's own SIGINT handler, when SigintStop left it in place) only
    // mark their signal; they run here, on this (the main) thread.
    if (!state.pending && PyErr_CheckSignals() != 0) state.pending = py::error_already_set();
    // With several trainers the flag carries the stop to the others (epoch_loop.hpp).
    if (state.pending) state.stop.store(true);
    return state.pending.has_value();
  };
  hooks.steps.stop_flag = &state.stop;
  if (!state.on_progress.is_none()) {
    // On card 0's thread: the GIL is taken for the call only (the main thread waits in the
    // engine without it).
    hooks.steps.on_progress = [&state](const trainer::StepProgress& p) {
      state.guarded([&] {
        py::dict d;
        d["pass"] = p.pass;
        d["step"] = p.step;
        d["steps"] = p.steps;
        d["examples_per_second"] = p.examples_per_second;
        d["auc"] = p.auc;
        d["seconds"] = p.seconds;
        state.on_progress(d);
      });
    };
  }
  return hooks;
}

// The config with in-memory data sets (memory_source.hpp) in place of its data folders: `train`
// replaces runner.train_data_dir and pass_dirs, `test` runner.test_data_dir ("" = keep).
trainer::TrainerConfig with_data(const LoadedConfig& config, const std::string& train,
                                 const std::string& test) {
  trainer::TrainerConfig out = config.config;
  // The config's folder lists (runner.train_data_dirs) win over the one folder where set: they
  // go too, or the config's folders would be trained in the data set's place.
  if (!train.empty()) {
    out.runner.train_data_dir = train;
    out.runner.train_data_dirs.clear();
    out.runner.pass_dirs.clear();
  }
  if (!test.empty()) {
    out.runner.test_data_dir = test;
    out.runner.test_data_dirs.clear();
  }
  return out;
}

// The launcher's environment, as gpubox_train reads it, with --threads_per_card.
trainer::TrainerEnv env_with(int threads_per_card) {
  trainer::TrainerEnv env = trainer::TrainerEnv::from_environment();
  env.threads_per_card = threads_per_card;
  return env;
}

// Runs `call` (the engine) with the GIL released; returns its failure as gpubox_train prints it
// after "gpubox_train: ", "" when it returned: a gpubox::Error's text (where it was raised
// logged), std::bad_alloc as the config's out-of-memory advice, anything else its what().
template <class Call>
std::string run_released(const LoadedConfig& config, Call&& call) {
  try {
    py::gil_scoped_release released;
    call();
  } catch (const Error& e) {
    GPUBOX_LOG(INFO) << "raised at " << e.where();
    return user_message(e);
  } catch (const std::bad_alloc& e) {
    return config::out_of_memory_text(*config.doc, e.what());
  } catch (const std::exception& e) {
    return user_message(e);
  }
  return {};
}

py::dict train(const LoadedConfig& config, const std::string& load, int threads_per_card,
               py::object on_pass, py::object on_epoch, const std::string& train_data,
               const std::string& test_data, py::object on_progress) {
  const trainer::TrainerConfig run_config = with_data(config, train_data, test_data);
  RunState state;
  state.on_pass = std::move(on_pass);
  state.on_epoch = std::move(on_epoch);
  state.on_progress = std::move(on_progress);
  const trainer::TrainerEnv env = env_with(threads_per_card);
  const trainer::RunHooks hooks = hooks_for(state);
  SigintStop sigint(&state.stop);  // until the run returns
  const std::string failure =
      run_released(config, [&] { trainer::train_job(run_config, env, load, hooks); });
  const bool interrupted = sigint.release();
  if (state.pending) throw std::move(*state.pending);  // the callback's error, or Ctrl-C
  if (!failure.empty()) raise(errors().engine_error, failure);
  if (interrupted) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  py::dict result;
  result["passes"] = state.passes;
  result["epochs"] = state.epochs;
  return result;
}

// gpubox_train --mode infer [--load LOAD] [--infer_data_dir DATA_DIR]: the same library call
// (run_job.hpp's infer_job); the last save's result. Ctrl-C sets the job's stop flag (read
// while the data is read, and between a PS mode's batches) and raises KeyboardInterrupt.
py::dict evaluate(const LoadedConfig& config, const std::string& load, const std::string& data_dir,
                  bool keep_predictions, int threads_per_card) {
  trainer::InferJob job;
  job.load = load;
  job.data_dir = data_dir;
  job.keep_predictions = keep_predictions;
  std::atomic<bool> stop{false};
  job.stop_flag = &stop;
  trainer::EvalResult result;
  SigintStop sigint(&stop);  // Ctrl-C stops reading the data (and a PS mode between batches)
  const trainer::TrainerConfig evaluated =
      keep_predictions ? trainer::one_row_per_line(config.config, "predictions=True")
                       : config.config;
  const std::string failure = run_released(
      config, [&] { result = trainer::infer_job(evaluated, env_with(threads_per_card), job); });
  if (sigint.release()) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  if (!failure.empty()) raise(errors().engine_error, failure);
  py::dict d;
  d["metrics"] = metrics_dict(result.metrics);
  d["labels"] =
      py::array_t<float>(static_cast<py::ssize_t>(result.labels.size()), result.labels.data());
  d["predictions"] = py::array_t<float>(static_cast<py::ssize_t>(result.predictions.size()),
                                        result.predictions.data());
  return d;
}

}  // namespace

void register_train(py::module_& m) {
  m.def("train", &train, py::arg("config"), py::arg("load") = "", py::arg("threads_per_card") = 0,
        py::arg("on_pass") = py::none(), py::arg("on_epoch") = py::none(),
        py::arg("train_data") = "", py::arg("test_data") = "", py::arg("on_progress") = py::none(),
        "Runs gpubox_train --mode train with `config` (from the save `load`, '' = the config's "
        "start); returns {'passes': [...], 'epochs': [...]}. Raises EngineError with the "
        "binary's text, a callback's exception, or KeyboardInterrupt (Ctrl-C stops the run "
        "between two steps; the stopped pass is not saved).");
  m.def("evaluate", &evaluate, py::arg("config"), py::arg("load") = "", py::arg("data_dir") = "",
        py::arg("keep_predictions") = false, py::arg("threads_per_card") = 0,
        "Runs gpubox_train --mode infer [--load LOAD] [--infer_data_dir DATA_DIR] (load '': "
        "the saves runner.infer_load_path names); returns the last save's {'metrics': {...}, "
        "'labels': array, 'predictions': array} (arrays empty unless kept). Raises EngineError "
        "with the binary's text, or KeyboardInterrupt (Ctrl-C stops reading the data).");
}

}  // namespace gpubox::python
