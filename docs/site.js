// ssm_course site: copy buttons on code cells and live search results. Every page works without this file.
(function () {
  "use strict";

  // Copy buttons: the code as text, without the output.
  document.querySelectorAll("div.sourceCode").forEach(function (div) {
    var code = div.querySelector("code");
    if (!code) return;
    var button = document.createElement("button");
    button.type = "button"; button.className = "copy"; button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy this code");
    function say(msg) { button.textContent = msg; setTimeout(function () { button.textContent = "Copy"; }, 1500); }
    button.addEventListener("click", function () {
      var text = code.textContent;
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { say("Copied"); }, function () { say("Not copied"); });
      } else {  // older browsers: select the code and use the copy command
        var range = document.createRange(); range.selectNodeContents(code);
        var sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range);
        say(document.execCommand("copy") ? "Copied" : "Press Ctrl+C");
      }
    });
    div.insertBefore(button, div.firstChild);
  });

  // Search: MiniSearch over the index that docs/build.py prebuilt. Both are loaded with <script> on first use,
  // because a page opened from file:// may not fetch() a JSON file.
  var engine = null;
  function load(src) {
    return new Promise(function (ok, fail) {
      var s = document.createElement("script"); s.src = src; s.onload = ok; s.onerror = fail; document.head.appendChild(s);
    });
  }
  function ready() {
    if (!engine) engine = Promise.all([load("vendor/minisearch.js"), load("search-index.js")]).then(function () {
      var ms = new MiniSearch({ fields: ["t", "x", "k"], searchOptions: { boost: { t: 3 }, prefix: true, fuzzy: 0.2, combineWith: "AND" } });
      ms.addAll(window.SSM_SEARCH_DOCS);
      return ms;
    });
    return engine;
  }
  function search(q, n) {
    return ready().then(function (ms) {
      return ms.search(q).slice(0, n).map(function (r) { return { doc: window.SSM_SEARCH_DOCS[r.id], terms: r.terms }; });
    });
  }
  function snippet(text, terms) {
    var low = text.toLowerCase(), at = -1;
    terms.forEach(function (t) { var i = low.indexOf(t.toLowerCase()); if (i >= 0 && (at < 0 || i < at)) at = i; });
    if (at < 0) return text.slice(0, 160) + (text.length > 160 ? "…" : "");
    var start = Math.max(0, at - 60), end = Math.min(text.length, at + 120);
    return (start > 0 ? "…" : "") + text.slice(start, end) + (end < text.length ? "…" : "");
  }
  function item(hit, withSnippet) {
    var li = document.createElement("li"), a = document.createElement("a"), where = document.createElement("span");
    a.href = hit.doc.p + (hit.doc.a ? "#" + hit.doc.a : ""); a.textContent = hit.doc.t;
    where.className = "where"; where.textContent = hit.doc.pt;
    li.appendChild(a); li.appendChild(where);
    if (withSnippet && hit.doc.x) {
      var p = document.createElement("p"); p.className = "snippet"; p.textContent = snippet(hit.doc.x, hit.terms); li.appendChild(p);
    }
    return li;
  }

  // Live results under each search box; Enter still opens search.html?q=..., which also works without JavaScript.
  document.querySelectorAll("form.search").forEach(function (form) {
    var input = form.querySelector("input"), list = document.createElement("ul"), timer = null;
    list.className = "search-live"; list.setAttribute("aria-label", "Search results");
    form.appendChild(list);
    input.addEventListener("focus", ready, { once: true });
    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        var q = input.value.trim();
        if (q.length < 2) { list.replaceChildren(); return; }
        search(q, 8).then(function (hits) { list.replaceChildren.apply(list, hits.map(function (h) { return item(h, false); })); });
      }, 120);
    });
    input.addEventListener("keydown", function (e) { if (e.key === "Escape") { input.value = ""; list.replaceChildren(); } });
  });

  // search.html?q=...: the full result list, with a snippet from each section.
  var out = document.getElementById("search-results");
  var q = new URLSearchParams(window.location.search).get("q");
  if (out && q) {
    document.querySelectorAll("form.search input").forEach(function (i) { i.value = q; });
    search(q, 50).then(function (hits) {
      var h = document.createElement("h2"), ol = document.createElement("ol");
      var n = hits.length, counted = n === 1 ? "1 section matches" : n + (n === 50 ? "+" : "") + " sections match";
      h.textContent = n ? counted + " “" + q + "”" : "No section matches “" + q + "”";
      hits.forEach(function (hit) { ol.appendChild(item(hit, true)); });
      out.replaceChildren(h, ol);
    });
  }
})();
