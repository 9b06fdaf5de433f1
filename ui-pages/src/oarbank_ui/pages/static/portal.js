// Keeps a rendered page's data current without reloading it: every few seconds it fetches the
// page's JSON view (the same view the server's templates drew) and redraws the data parts of
// each table, status, kv, stat, progress, json and logs (charts redraw with the page). Text
// goes in with textContent only, never as markup; a link only to a path of this portal.
(function () {
  "use strict";
  var page = document.querySelector("[data-refresh-url]");
  if (!page) { return; }
  var url = page.getAttribute("data-refresh-url");
  var period = parseInt(page.getAttribute("data-refresh-ms"), 10) || 3000;
  var state = document.getElementById("refresh-state");

  function content(c) {
    var el;
    if (c.type === "status" && !c.wrong && c.text) {
      el = document.createElement("span");
      el.className = "badge tone-" + c.tone;
      el.textContent = c.text;
      return el;
    }
    if ((c.type === "code" || c.type === "digest") && !c.wrong && c.text) {
      el = document.createElement("code");
      el.textContent = c.text;
      return el;
    }
    if (c.href && c.href.charAt(0) === "/" && c.href.charAt(1) !== "/") {  // this portal's page
      el = document.createElement("a");
      el.setAttribute("href", c.href);
      el.textContent = c.text;
      return el;
    }
    return document.createTextNode(c.text);
  }

  function fill(el, c) {
    el.className = "t-" + c.type + (c.wrong ? " wrong" : "") +
      (c.tone && c.type !== "status" ? " tone-" + c.tone : "");
    if (c.title) { el.title = c.title; } else { el.removeAttribute("title"); }
    el.replaceChildren(content(c));
  }

  function availability(el, v) {
    var u = el.querySelector(":scope > .unavailable");
    var d = el.querySelector(":scope > .data");
    if (u) { u.hidden = !v.unavailable; u.title = v.reason || ""; }
    if (d) { d.hidden = !!v.unavailable; }
  }

  var draw = {
    table: function (el, v) {
      availability(el, v);
      var tbody = el.querySelector("tbody");
      var rows = v.rows.map(function (row) {
        var tr = document.createElement("tr");
        row.forEach(function (c) {
          var td = document.createElement("td");
          fill(td, c);
          tr.appendChild(td);
        });
        return tr;
      });
      if (!rows.length) {
        var tr = document.createElement("tr");
        var td = document.createElement("td");
        tr.className = "empty";
        td.colSpan = v.columns.length;
        td.textContent = "no rows";
        tr.appendChild(td);
        rows.push(tr);
      }
      tbody.replaceChildren.apply(tbody, rows);
    },
    status: function (el, v) {
      availability(el, v);
      var span = el.querySelector(":scope > .data > span");
      if (span) { fill(span, v.value); }
    },
    stat: function (el, v) {
      availability(el, v);
      var span = el.querySelector(":scope > .data > span");
      if (span) { fill(span, v.value); }
    },
    progress: function (el, v) {
      availability(el, v);
      var text = el.querySelector(":scope > .data > .value");
      var fillRect = el.querySelector(":scope > .data rect.fill");
      var bar = el.querySelector(":scope > .data svg.bar");
      if (text) { text.textContent = v.text; }
      if (fillRect) { fillRect.setAttribute("width", String(v.fraction || 0)); }
      if (bar && v.fraction !== null) { bar.setAttribute("aria-valuenow", String(v.fraction)); }
    },
    json: function (el, v) {
      availability(el, v);
      var pre = el.querySelector(":scope > .data");
      if (pre) { pre.textContent = v.text; }
    },
    logs: function (el, v) {
      availability(el, v);
      var pre = el.querySelector(":scope > .data");
      if (!pre) { return; }
      pre.replaceChildren.apply(pre, v.lines.map(function (line) {
        return document.createTextNode((line.at ? line.at + " " : "") + line.text + "\n");
      }));
    },
    kv: function (el, v) {
      availability(el, v);
      var dds = el.querySelectorAll(":scope > .data > dd");
      v.items.forEach(function (item, i) { if (dds[i]) { fill(dds[i], item.value); } });
    }
  };

  function apply(doc) {
    Object.keys(doc.components).forEach(function (cid) {
      var v = doc.components[cid];
      var el = page.querySelector('[data-cid="' + cid + '"]');
      // A page file edited since this page loaded: leave what no longer matches alone.
      if (el && el.getAttribute("data-kind") === v.kind && draw[v.kind]) { draw[v.kind](el, v); }
    });
    if (state) { state.textContent = "updated " + doc.rendered_at; state.className = ""; }
  }

  function tick() {
    fetch(url, {cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(apply)
      .catch(function (e) {
        if (state) { state.textContent = "refresh failed (" + e.message + "), retrying"; state.className = "stale"; }
      })
      .then(function () { setTimeout(tick, period); });
  }
  setTimeout(tick, period);
}());
