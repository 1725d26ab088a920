"""Job submissions, and reads of stored jobs, that held the server's one thread (issue 23's gaps and the red-team
pass over this round; docs/security.md, "Floods and storage", "Time" under "Paths", and "Downloads").

- A job's HDF5 list was checked in the server's thread, a line at a time: 40,000 lines held it 3.5 s at POST
  /api/jobs and again at the New model form's preview and Create. It is checked in a dataset reader now
  (datasets.hdf5_list_files), within the read's deadline: /devices keeps answering, and a list naming a file
  outside the roots is refused without that file being opened. An ImageData list takes turns (turns.py).
- A recurrent net's nets were built (submission, preview) and planned (preview, placing, attempts) in the server's
  thread: an 8 KB LSTM net takes ~10 s to build up to the 50,000-layer limit here. They go to an estimate worker
  by the same predicted cost as estimates do (jobs.scheduling.planning): /devices keeps answering while ten are posted.
- Reads anyone allowed to read may repeat: a stored job's clone page and trained model parsed its texts (3.6 MB:
  2.5 s) and built its deploy net in the server's thread; its snapshots' listing opened every snapshot file (a
  job with `snapshot: 1`); its progress read every record in one go (100,000 iterations: 1.1 s).

Every attack runs against a real server while /devices is asked every 50 ms, each within 1 s.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from load_cases import EIGHT_KB_LSTM_LAYERS, UNROLLED, hdf5_lenet, long_hdf5_list, lstm_net, probing
from test_hardening_floods import Served, start
from test_hardening_paths import Watch, hdf5, lenet_with, train_data
from test_hardening_readers import h5_file, under_attack
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for, write_lmdb

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.planning.job_plan import PlanningPolicy
from digits_memplugin.estimate.datasets import MAX_JOB_LIST_ANSWER, MAX_JOB_LIST_LINES, hdf5_list_files
from digits_memplugin.estimate.pool import EstimatePool
from digits_memplugin.jobs.definition.definition import JobDefinition, net_facts
from digits_memplugin.jobs.definition.loading import load_definition
from digits_memplugin.jobs.scheduling.attempt_loop import plan_for
from digits_memplugin.jobs.scheduling.planning import SHIPPED, Planner, cost_of, received, shipped

pytest_plugins = ["test_jobs_fixtures"]

LINES = 40_000
IMAGES = 300_000
"""Lines of an ImageData list: each was resolved in the server's thread at submission (about 6 s here)."""
DEVICES_WITHIN = 1.0


# ============================================================================ a job's long HDF5 list


@pytest.fixture(scope="module")
def lists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose data folder's dataset root holds one HDF5 file under 40,000 names and lists of them
    (load_cases.long_hdf5_list): long.txt names each once (40,000 lookups, about 3 s of the server's thread before);
    long_out.txt the same, then a file outside the roots. outside/ holds that file."""
    folder = tmp_path_factory.mktemp("lists")
    long_hdf5_list(folder / "data" / "datasets", LINES)
    (folder / "data" / "datasets" / "images.txt").write_text("".join(f"i/{n}.png {n % 10}\n" for n in range(IMAGES)))
    (folder / "outside").mkdir()
    h5_file(folder / "outside" / "secret.h5", lambda h5: h5.__setitem__("data", np.ones((4, 1, 28, 28), np.float32)))
    return folder


def hdf5_job(source: str) -> dict[str, Any]:
    return {"net": hdf5_lenet(source), "solver": SHORT_SOLVER, "data": {"test": "mnist_test_lmdb"},
            "device": "cpu", "max_iter": 2}


def hdf5_form(train: str) -> dict[str, Any]:
    """The New model form's JSON twin: the standard LeNet on HDF5 lists."""
    return {"model_name": "long", "data_backend": "hdf5", "train_source": train, "val_source": "good.txt",
            "device": "cpu", "batch_size": "4", "max_iter": 2}


@pytest.mark.slow
def test_a_long_hdf5_list_is_checked_off_the_server_thread_and_a_file_outside_is_never_opened(lists: Path) -> None:
    """POST /api/jobs, the form's preview and its Create with the 40,000-line list, and with the list whose last
    line is outside the roots: /devices answers within 1 s throughout (3.5 s without an answer before); the long
    list makes its job (or, on a machine too slow to check it within the read's deadline, a 400 saying so), the
    other is a 400 naming the line, with nothing outside opened (inotify) and no job or folder made."""
    server = start(lists)
    watch = Watch(lists / "outside")
    try:
        jobs = lists / "data" / "jobs"
        requests.get(server.api("/devices"), timeout=60)
        made = under_attack(server, lambda: requests.post(server.api("/jobs"), json=hdf5_job("long.txt"), timeout=60),
                            at_least=0)
        if made.status_code == 400:  # checked too slowly here: the deadline's words, naming the list
            assert "long.txt names 40000 files, more than could be checked in the" in made.text, made.text
        else:
            assert made.status_code == 201, made.text
            requests.post(server.api(f"/jobs/{made.json()['id']}/cancel"), timeout=30)
        folders = set(os.listdir(jobs))

        refused = under_attack(
            server, lambda: requests.post(server.api("/jobs"), json=hdf5_job("long_out.txt"), timeout=60), at_least=0
        )
        assert refused.status_code == 400, refused.text
        said = refused.json()["errors"]["net"]
        assert "../../outside/secret.h5 is outside the dataset folders" in said["message"], said
        assert (said["layer"], said["field"]) == ("mnist", "hdf5_data_param.source"), said

        url = f"{server.url}memplugin/models"
        for path in ("/preview.json", ".json"):  # the form's preview, and its Create
            form = under_attack(
                server, lambda path=path: requests.post(url + path, json=hdf5_form("long_out.txt"), timeout=60),
                at_least=0,
            )
            assert form.status_code == 400, form.text
            assert "outside the dataset folders" in str(form.json()["errors"]), form.text
        assert set(os.listdir(jobs)) == folders  # no job folder made, none left behind
        assert watch.events() == []  # nothing outside the roots opened or read, by the server or its readers
    finally:
        watch.close()
        server.stop()


@pytest.mark.slow
def test_a_long_image_list_is_checked_taking_turns_with_the_other_requests(lists: Path) -> None:
    """A job whose ImageData list has 300,000 lines: each is resolved in the server's thread, which now lets the
    other requests run every 20 ms (and stops at the read's deadline): /devices answers within 1 s throughout."""
    server = start(lists)
    try:
        requests.get(server.api("/devices"), timeout=60)
        net = lenet_with(train_data('image_data_param { source: "images.txt" batch_size: 64 is_color: false }', "ImageData"))
        body = {"net": net, "solver": SHORT_SOLVER, "data": {"test": "mnist_test_lmdb"}, "device": "cpu",
                "max_iter": 2, "data_shapes": {"data": [1, 28, 28]}}
        answer = under_attack(server, lambda: requests.post(server.api("/jobs"), json=body, timeout=120), at_least=0)
        assert answer.status_code in (201, 400), answer.text
        if answer.status_code == 400:
            assert "images.txt lists 300000 images, more than could be checked" in answer.text, answer.text
        else:
            requests.post(server.api(f"/jobs/{answer.json()['id']}/cancel"), timeout=30)
    finally:
        server.stop()


# ============================================================================ recurrent nets submitted


EIGHT_KB = EIGHT_KB_LSTM_LAYERS


def lstm_job(net: str, **fields: Any) -> dict[str, Any]:
    return {"net": net, "solver": SHORT_SOLVER, "device": "cpu", "max_iter": 2, **fields}


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[Served]:
    """`serve`'s app with one estimate worker and one waiting place (so that ten submissions of a net that costs
    ~10 s in a worker end in ~20 s: one built, one waiting, eight refused at once)."""
    server = start(tmp_path, {"MEMPLUGIN_ESTIMATE_WORKERS": 1, "MEMPLUGIN_ESTIMATE_QUEUE": 1})
    yield server
    server.stop()


def post_at_once(url: str, bodies: list[dict[str, Any]], method: str = "POST") -> list[requests.Response]:
    """One request per body, each from its own client, all at once (a GET sends no body)."""
    answers: list[requests.Response] = []

    def send(body: dict[str, Any]) -> None:
        answers.append(requests.request(method, url, json=body if method == "POST" else None, timeout=300))

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(320)
    return answers


@pytest.mark.slow
def test_recurrent_nets_submitted_and_previewed_are_built_and_planned_off_the_server_thread(tight: Served) -> None:
    """Ten POST /api/jobs of the 8 KB LSTM net at once, then its preview and Create in the form's JSON twin, then
    a small LSTM job with batch "auto" until the scheduler has placed it: /devices answers within 1 s throughout
    (before, each submission held the server's thread ~10 s). The 8 KB net is a 400 naming the build limit (built
    by the worker) or a 503 with Retry-After (the worker and its waiting place taken), and no job is stored."""
    api = tight.api("")
    requests.get(f"{api}/devices", timeout=60)
    with probing(api, timeout=30) as probe:
        time.sleep(0.3)
        answers = post_at_once(f"{api}/jobs", [lstm_job(lstm_net(EIGHT_KB, 500, f"try {n}")) for n in range(10)])
        preview = requests.post(f"{tight.url}memplugin/models/preview.json", timeout=300, json={
            "model_name": "lstm", "network": "custom", "custom_network": lstm_net(EIGHT_KB, 500, "form"),
            "solver": "custom", "solver_text": SHORT_SOLVER, "device": "cpu", "batch_size": "auto", "max_iter": 2})
        made = requests.post(f"{api}/jobs", json=lstm_job(UNROLLED, batch="auto"), timeout=300)
        assert made.status_code == 201, made.text
        job = made.json()["id"]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and requests.get(f"{api}/jobs/{job}", timeout=30).json()["status"] == "queued":
            time.sleep(0.5)
        placed = requests.get(f"{api}/jobs/{job}", timeout=30).json()
        requests.post(f"{api}/jobs/{job}/cancel", timeout=30)
    assert len(answers) == 10
    for answer in answers:
        if answer.status_code == 503:
            assert answer.headers.get("Retry-After") and "the server is busy" in answer.json()["error"], answer.text
        else:
            assert answer.status_code == 400, answer.text
            assert "the estimator builds at most 50000" in answer.json()["errors"]["net"]["message"], answer.text
    assert any(answer.status_code == 400 for answer in answers)
    assert preview.status_code in (400, 503), preview.text  # the build limit again, or the worker still busy
    assert placed["status"] != "queued" and "could not be planned" not in placed["message"], placed  # placed
    assert requests.get(f"{api}/jobs", timeout=30).json()["total"] == 1  # the small job alone
    assert not probe.failures and probe.slowest < DEVICES_WITHIN, probe.summary()


# ============================================================================ where a job is built and planned


INPUT_NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 8 dim: 1 dim: 4 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 3 } }
"""
"""A small net without a recurrent layer: built and planned in the server's thread."""
SMALL_LSTM = lstm_net(2, 12)
"""Two LSTM layers over 12 timesteps: cheap as written, but any recurrent layer is predicted at 500 timesteps."""


@pytest.fixture
def planner() -> Iterator[Planner]:
    pool = EstimatePool(1, 2)
    yield Planner(None, pool)
    pool.close()


def definition(tmp_path: Path, net: str, planner: Planner | None = None) -> JobDefinition:
    folder = tmp_path / f"job{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    return load_definition(net, SHORT_SOLVER, folder=folder, roots=[tmp_path],
                           facts=planner.facts if planner else None)


def test_a_job_is_built_and_planned_where_its_predicted_cost_says(planner: Planner, tmp_path: Path) -> None:
    """The small net stays here; the LSTM net is built and planned in the worker, with the answers the server
    would give; its footprints come back, so the same plan asked again (the scheduler's next poll) is answered
    here, building nothing; a definition the worker cannot build is the same NetError, field and all."""
    plain = definition(tmp_path, INPUT_NET, planner)
    assert (planner.offloaded, plain.net_batch) == (0, 8)
    ask = {"engine": "cpu", "limit_bytes": 1 << 30, "policy": PlanningPolicy()}
    planner.plan({"batch": "auto"}, plain, **ask)
    assert planner.offloaded == 0 and cost_of(plain, plans=1).layers <= planner.pool.inline_layers  # type: ignore[union-attr]

    here = definition(tmp_path, SMALL_LSTM)
    there = definition(tmp_path, SMALL_LSTM, planner)
    assert planner.offloaded == 1 and cost_of(there, plans=0).unrolls
    assert (there.net_batch, there.test_batches, there.threads) == (here.net_batch, here.test_batches, here.threads)
    decision = planner.plan({"batch": "auto"}, there, **ask)
    assert planner.offloaded == 2
    assert decision == plan_for({"batch": "auto"}, here, None, **ask)
    assert planner.plan({"batch": "auto"}, there, **ask) == decision and planner.offloaded == 2  # from what it learned

    with pytest.raises(NetError) as built:
        definition(tmp_path, lstm_net(EIGHT_KB, 500), planner)
    assert planner.offloaded == 3 and "the estimator builds at most 50000" in built.value.message
    assert built.value.layer is not None


def test_a_copy_sent_to_a_worker_holds_no_built_net(tmp_path: Path) -> None:
    """What a worker is sent: the nets and solver, not the reports estimators kept (built nets: hundreds of MB for
    an unrolled one), and the one net the train and test nets are made of still one."""
    made = definition(tmp_path, SMALL_LSTM)
    assert made.training.memo and made.training.train.param is made.training.tests[0].param
    first = shipped(made)
    data, rest = pickle.loads(pickle.dumps(first))
    sent = received(data, rest)
    assert sent.training.memo == {} and SHIPPED in made.training.memo
    assert sent.training.train.param is sent.training.tests[0].param
    assert len(data) < 2 * len(SMALL_LSTM + SHORT_SOLVER) + 4096
    assert net_facts(sent) == net_facts(made)
    assert shipped(made)[0] is first[0]  # serialised once


# ============================================================================ a job's HDF5 list: its other bounds


WHERE = {"layer": "mnist", "layer_type": "HDF5Data", "field": "hdf5_data_param.source"}


def test_a_job_list_past_its_lines_or_naming_too_many_files_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    h5_file(root / "one.h5", lambda h5: h5.__setitem__("data", np.zeros((1, 1), dtype=np.float32)))
    (root / "many.txt").write_text("one.h5\n" * (MAX_JOB_LIST_LINES + 1))
    with pytest.raises(NetError) as lines:
        hdf5_list_files(root / "many.txt", [root], name="many.txt", **WHERE)
    assert lines.value.message == (f"many.txt has {MAX_JOB_LIST_LINES + 2} lines; a job's HDF5 list may name at most "
                                   f"{MAX_JOB_LIST_LINES} files") and lines.value.field == WHERE["field"]
    names = root / ("n" * 200)
    names.mkdir()
    for index in range(4000):  # each real path takes over 250 bytes of the answer: 4000 take over 1 MB
        (names / f"{'f' * 40}{index}.h5").touch()
    assert MAX_JOB_LIST_ANSWER < 4000 * 250
    (root / "wide.txt").write_text("".join(f"{names.name}/{'f' * 40}{index}.h5\n" for index in range(4000)))
    with pytest.raises(NetError) as wide:
        hdf5_list_files(root / "wide.txt", [root], name="wide.txt", **WHERE)
    assert wide.value.message.startswith("wide.txt names more different files than a job's HDF5 list may"), wide.value
    # Names in other letters take 6 bytes a letter in the reader's answer (JSON escapes them), 3 in UTF-8: counted
    # as UTF-8, 2,000 of them (690 KB) passed the bound and the answer (1.15 MB) was refused as not an answer.
    letters = root / "letters"
    letters.mkdir()
    for index in range(2000):
        (letters / f"{'日' * 80}{index}.h5").touch()
    (root / "letters.txt").write_text("".join(f"letters/{'日' * 80}{index}.h5\n" for index in range(2000)))
    with pytest.raises(NetError) as spelled:
        hdf5_list_files(root / "letters.txt", [root], name="letters.txt", **WHERE)
    assert spelled.value.message.startswith("letters.txt names more different files than"), spelled.value


def test_a_data_source_whose_links_loop_is_a_400_naming_the_field(app: Any, data_dir: Path) -> None:
    """`ln -s loop loop` in a dataset root, named by a job's data, an HDF5 list's line and an estimate that reads
    its datasets: Python 3.11's resolve() raised RuntimeError on it, a 500 each time."""
    root = data_dir / "datasets"
    root.mkdir(parents=True, exist_ok=True)
    os.symlink("loop", root / "loop")
    (root / "loops.txt").write_text("loop\n")
    for data, field in (({"train": "loop"}, "data_param.source"), ({}, "hdf5_data_param.source")):
        body = {"net": lenet_with(hdf5("loops.txt")) if not data else lenet_with(), "solver": SHORT_SOLVER,
                "data": {**data, "test": "loop"} if data else {"test": "loop"}, "device": "cpu", "max_iter": 2}
        answer = app.test_client().post("/memplugin/api/jobs", json=body)
        assert answer.status_code == 400, answer.get_data(as_text=True)
        said = next(iter(answer.get_json()["errors"].values()))
        assert "its links lead round in a loop" in said["message"] and said["field"] == field, said
    assert not (data_dir / "jobs").exists() or os.listdir(data_dir / "jobs") == []
    net = lenet_with(train_data('data_param { source: "loop" batch_size: 64 backend: LMDB }'))
    estimate = app.test_client().post("/memplugin/api/estimate", json={"net": net, "read_datasets": True})
    assert estimate.status_code == 400, estimate.get_data(as_text=True)
    said = estimate.get_json()["errors"]["read_datasets"]
    assert said["detail"] == "loop cannot be looked up: its links lead round in a loop", said


# ============================================================================ reads of a stored job: clone, download


STAGES = 330_000
"""`stage: 's'` entries in LeNet's loss layer's exclude rule: a valid 3.6 MB net (its job trains), 2.5 s to parse."""


def big_lenet() -> str:
    return LENET.replace('name: "loss"', 'name: "loss"\n  exclude {' + " stage: 's'" * STAGES + " }", 1)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str, str]]:
    """`serve` holding two trained jobs with snapshots: LeNet with a 3.6 MB net, and six LSTM layers over 500
    timesteps (its deploy net unrolls into 9,000 layers)."""
    folder = tmp_path_factory.mktemp("stored")
    datasets = folder / "data" / "datasets"
    datasets.mkdir(parents=True)
    write_lmdb(datasets / "mnist_train_lmdb")
    write_lmdb(datasets / "mnist_test_lmdb", records=8)
    server = start(folder)
    try:
        made = [
            requests.post(server.api("/jobs"), timeout=300, json={
                "net": big_lenet(), "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2}),
            requests.post(server.api("/jobs"), timeout=300, json={
                "net": UNROLLED, "solver": 'base_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n', "device": "cpu"}),
        ]
        ids = []
        for answer in made:
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        for job in ids:
            ended = wait_for(lambda job=job: (doc := requests.get(server.api(f"/jobs/{job}"), timeout=60).json())
                             ["status"] in ("done", "failed") and doc, timeout=600, what=f"job {job} to end")
            assert ended["status"] == "done", ended
        yield server, ids[0], ids[1]
    finally:
        server.stop()


@pytest.mark.slow
def test_a_stored_jobs_clone_and_trained_model_are_made_off_the_server_thread(stored: tuple[Served, str, str]) -> None:
    """The clone page and the trained model of a job with a 3.6 MB net (each parsed it in the server's thread: 2.5
    s), and the trained model of an LSTM job (its deploy net was built there: seconds): /devices answers within 1 s
    throughout, and each answer is whole (the clone page with the net pasted, the archives with their weights, the
    LSTM's with its deploy net)."""
    server, big, lstm = stored
    clone = under_attack(server, lambda: requests.get(f"{server.url}memplugin/models/new?clone={big}", timeout=120))
    assert clone.status_code == 200 and " stage: &#39;s&#39;" * 3 in clone.text, clone.text[:300]
    for job in (big, lstm):
        archive = under_attack(server, lambda job=job: requests.get(server.api(f"/jobs/{job}/model.tar.gz"),
                                                                    timeout=120))
        assert archive.status_code == 200, archive.text[:300]
        with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
            info = json.loads(tar.extractfile("info.json").read())  # type: ignore[union-attr]
            assert "train_val.prototxt" in tar.getnames() and info["snapshot"]["weights"] in tar.getnames(), info
            if job == lstm:  # its deploy net is the net itself, unrolled (LeNet's loss reads labels: none)
                assert info["deploy"] == "deploy.prototxt" and "deploy.prototxt" in tar.getnames(), info


TINY_NET = """
layer { name: "d" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 1 dim: 1 } shape { dim: 1 dim: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 1 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
SNAPSHOTS = 6000


@pytest.mark.slow
def test_a_job_with_thousands_of_snapshots_lists_the_newest_and_its_page_leaves_the_server_answering(
    tmp_path: Path,
) -> None:
    """A tiny net trained 6,000 iterations with `snapshot: 1` (a few seconds): every page view and GET of its
    snapshots opened each of its files (0.8 s of the server's thread for 5,000). The page lists the newest 20 and
    the JSON the newest 500, with the total and the `before` of older pages; /devices answers within 1 s throughout
    (each asked for again for a second)."""
    server = start(tmp_path)
    try:
        solver = f'base_lr: 0.01\nlr_policy: "fixed"\nmax_iter: {SNAPSHOTS}\nsnapshot: 1\nsnapshot_prefix: "tiny"\n'
        made = requests.post(server.api("/jobs"), json={"net": TINY_NET, "solver": solver, "device": "cpu"}, timeout=60)
        assert made.status_code == 201, made.text
        job = made.json()["id"]
        ended = wait_for(lambda: (doc := requests.get(server.api(f"/jobs/{job}"), timeout=60).json())["status"]
                         in ("done", "failed") and doc, timeout=600, what="the job to end")
        assert ended["status"] == "done", ended
        listing = under_attack(server, lambda: requests.get(server.api(f"/jobs/{job}/snapshots"), timeout=60).json())
        total = listing["total"]
        assert total > 2000 and len(listing["snapshots"]) == 500, (total, len(listing["snapshots"]))
        newest = [snapshot["iteration"] for snapshot in listing["snapshots"]]
        assert newest == sorted(newest) and newest[-1] == SNAPSHOTS and listing["older"] == newest[0]
        page = under_attack(server, lambda: requests.get(f"{server.url}memplugin/jobs/{job}", timeout=60))
        assert page.status_code == 200 and f"The latest 20 of {total} snapshots" in page.text
        older = requests.get(server.api(f"/jobs/{job}/snapshots?limit=3&before={newest[0]}"), timeout=60).json()
        iterations = [snapshot["iteration"] for snapshot in older["snapshots"]]
        assert len(iterations) == 3 and iterations[-1] < newest[0] and older["total"] == total, older
        first = requests.get(server.api(f"/jobs/{job}/snapshots/1/caffemodel"), timeout=60)
        assert first.status_code == 200 and first.content  # an old one is still served by its iteration
        for bad in ("limit=0", "limit=501", "before=x", "limit=%C2%B2"):
            refused = requests.get(server.api(f"/jobs/{job}/snapshots?{bad}"), timeout=60)
            assert refused.status_code == 400 and "must be" in refused.json()["error"], (bad, refused.text)
    finally:
        server.stop()


@pytest.mark.slow
def test_the_progress_of_a_long_job_is_read_taking_turns_with_the_other_requests(tmp_path: Path) -> None:
    """A tiny net trained 100,000 iterations writes a record an iteration (20 MB): GET /jobs/<id>/progress, which
    every job page asks for on first paint, read them all in one go (1.1 s of the server's thread a request). It
    lets the other requests in every 20 ms now: /devices answers within 1 s while three pages ask for it at once,
    again for a second, and the chart's records are the same 2,000 points."""
    server = start(tmp_path)
    try:
        solver = 'base_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 100000\n'
        made = requests.post(server.api("/jobs"), json={"net": TINY_NET, "solver": solver, "device": "cpu"}, timeout=60)
        assert made.status_code == 201, made.text
        job = made.json()["id"]
        ended = wait_for(lambda: (doc := requests.get(server.api(f"/jobs/{job}"), timeout=60).json())["status"]
                         in ("done", "failed") and doc, timeout=900, what="the job to end")
        assert ended["status"] == "done", ended
        answers = under_attack(server, lambda: [answer.json() for answer in post_at_once(
            server.api(f"/jobs/{job}/progress"), [{}] * 3, method="GET")])  # three pages opened at once
        progress = answers[0]
        assert all(answer == progress for answer in answers)
        iterations = [record for record in progress["records"] if record.get("event") == "iteration"]
        assert 2000 <= len(iterations) <= 2001 and iterations[-1]["iteration"] == 100000, len(iterations)
    finally:
        server.stop()
