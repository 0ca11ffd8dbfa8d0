// Refresh: every 5 s, fetch this page again and swap its main part and its
// "updated" time; pause (kept across pages) stops it. No framework: the
// server renders, the script only replaces.
(function () {
  var every = 5000, key = "bmdb-refresh-paused", n = 0;
  var btn = document.getElementById("pause"), state = document.getElementById("refresh-state");
  if (!btn) return;
  function paused() { try { return localStorage.getItem(key) === "1"; } catch (e) { return false; } }
  function show() { btn.textContent = paused() ? "resume" : "pause"; state.textContent = paused() ? "paused" : "refreshing every 5 s"; }
  btn.addEventListener("click", function () { try { localStorage.setItem(key, paused() ? "0" : "1"); } catch (e) {} show(); });
  // An operator filling in a form (a reason, a cap) keeps the page.
  function editing() {
    var a = document.activeElement;
    if (a && a.form && a.closest("main")) return true;
    return Array.prototype.some.call(document.querySelectorAll("main form input[type=text], main form input[type=number]"),
      function (i) { return i.value !== i.defaultValue; });
  }
  function tick() {
    if (paused() || editing()) { setTimeout(tick, every); return; }
    fetch(location.href, {headers: {Accept: "text/html"}, cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var main = doc.querySelector("main"), updated = doc.getElementById("updated");
        if (!main || !updated) throw new Error("unexpected page");
        document.querySelector("main").replaceWith(main);
        document.getElementById("updated").replaceWith(updated);
        document.body.dataset.refreshes = ++n;
        show();
      })
      .catch(function (e) { state.textContent = "update failed (" + e.message + "), retrying"; })
      .then(function () { setTimeout(tick, every); });
  }
  show();
  setTimeout(tick, every);
})();
