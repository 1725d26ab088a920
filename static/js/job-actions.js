/* digits-memplugin: Cancel and Delete in the jobs list, asked first in a dialog of the page (<dialog id="mp-confirm">,
 * templates/memplugin/job_confirm_dialog.html, with the texts of web/pages/job_actions.py). Each row's button is a form post
 * to the confirmation step (a page of its own without JavaScript); here its submit opens the dialog, and "confirm"
 * calls the REST API (POST api/jobs/<id>/cancel, DELETE api/jobs/<id>). The list itself follows from the `jobs` room:
 * a cancelled job's row changes, a deleted one goes. A refusal (a job that started running meanwhile) is said in the
 * dialog, which stays open. */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const body = document.getElementById("jobs-body");
  const dialog = document.getElementById("mp-confirm");
  const texts = MP.readJSON("mp-confirmations");
  if (!body || !dialog || !texts || typeof dialog.showModal !== "function") return;
  const question = document.getElementById("mp-confirm-question");
  const detail = document.getElementById("mp-confirm-detail");
  const error = document.getElementById("mp-confirm-error");
  const keep = document.getElementById("mp-confirm-keep");
  const confirm = document.getElementById("mp-confirm-action");
  const apiUrl = (id) => body.dataset.apiUrl + "/" + encodeURIComponent(id);
  let pending = null;

  function ask(row, action) {
    const text = texts[action];
    const name = row.querySelector('[data-role="name"]').textContent.trim();
    pending = { id: row.dataset.jobId, action };
    question.textContent = text.question.replace("{name}", name);
    detail.textContent = text.detail;
    confirm.textContent = text.button;
    keep.textContent = text.keep;
    error.hidden = true;
    error.textContent = "";
    confirm.disabled = false;
    dialog.dataset.action = action;
    dialog.dataset.jobId = pending.id;
    dialog.showModal();
  }

  async function act() {
    if (!pending) return;
    const { id, action } = pending;
    confirm.disabled = true;
    let answer;
    try {
      answer = action === "cancel"
        ? await MP.requestJSON(apiUrl(id) + "/cancel", { method: "POST", body: {} })
        : await MP.requestJSON(apiUrl(id), { method: "DELETE" });
    } catch (failure) {
      answer = { ok: false, status: 0, data: { error: "the server cannot be reached" } };
    }
    confirm.disabled = false;
    if (answer.ok) {
      pending = null;
      dialog.close("done");
      return;
    }
    error.textContent = "The job was not " + texts[action].done + ": " +
      ((answer.data && answer.data.error) || "the server answered " + answer.status) + ".";
    error.hidden = false;
  }

  body.addEventListener("submit", (event) => {
    const form = event.target.closest("form.mp-job-action");
    if (!form) return;
    event.preventDefault();
    ask(form.closest("tr"), form.dataset.action);
  });
  dialog.addEventListener("submit", (event) => {
    if (event.submitter && event.submitter.value === "confirm") {
      event.preventDefault();
      act();
    } else {
      pending = null;
    }
  });
  dialog.addEventListener("close", () => { pending = null; });
  MP.jobActions = { ask, act };
})();
