"""A parameter-server worker's step in the measurement's terms: the servers' update is time the
worker waits between its push and its pull, which the executor measures as communication."""

from dataclasses import replace

import pytest
from test_calibration import local_scenario
from test_calibration_phases import phased, truth

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.cpu_optimizer import ps_worker_time
from simdist.analytic.stage import describe
from simdist.analytic.steptime import reduce_step
from simdist.calibrate.compare import predicted_quantities
from simdist.calibrate.refit import microbenchmark_part
from simdist.calibrate.terms import fit_checks, fit_terms
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.software_layers import BASE_TERMS

PS = {"gradient_sync": "parameter-server", "parameter_servers": 2, "optimizer": "lars", "micro_batch_size": 1}


def ps_truth():
    t = truth()
    return replace(t, optimizer_layer_tensor_s={**t.optimizer_layer_tensor_s, "ps": 4e-6})


def test_the_servers_update_is_the_workers_communication_not_its_optimizer():
    t = ps_truth()
    sc = scenario_from_dict(local_scenario(**PS))
    server = reduce_step(describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision, t), Network.of(sc.cluster, t)))
    assert server.server_update_s > 0  # the servers' LARS step on the local host's CPU
    q, b = predicted_quantities(sc, t), predict(sc, profile=t, engine="analytic").breakdown_s
    assert q["optimizer_s"] == pytest.approx(ps_worker_time(sc, t, 0))  # the client's own copies, tensor by tensor
    assert q["optimizer_s"] == pytest.approx(b["optimizer"] - server.server_update_s)
    assert q["comm_s"] == pytest.approx(b["dp_comm"] + server.server_update_s)
    plain = scenario_from_dict(local_scenario())
    assert predicted_quantities(plain, t)["optimizer_s"] == predict(plain, profile=t, engine="analytic").breakdown_s["optimizer"]


def test_a_parameter_server_fit_run_is_reproduced_without_a_wait_standing_for_the_update():
    """Measured as the executor measures it (the update inside the worker's communication), the
    fit finds no wait the model does not price, and the fitted profile reproduces the run."""
    t = ps_truth()
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(t, "ps", **PS)[1]]
    fitted, bounds, unusable = fit_terms(microbenchmark_part(t), runs)
    assert unusable == [] and not [b for b in bounds if b.hit]
    assert fitted.sync_wait_fractions.get("ps", 0.0) == pytest.approx(0.0, abs=1e-3)
    assert fitted.sync_wait_fractions[BASE_TERMS] == pytest.approx(0.05, rel=0.05, abs=1e-3)
    assert fitted.optimizer_layer_tensor_s["ps"] == pytest.approx(4e-6, rel=0.05)
    assert all(abs(c.error) < 0.01 for c in fit_checks(fitted, runs))
