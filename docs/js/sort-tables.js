// Click a column heading of a table to sort its rows by that column; click again to reverse.
// Cells that read as numbers (a "±" interval is read by its mean) sort numerically, "-" last.
(function () {
  "use strict";
  function key(cell) {
    var text = cell.textContent.trim();
    var number = parseFloat(text.split("±")[0].replace(/,/g, ""));
    return { text: text, number: text === "-" || isNaN(number) ? null : number };
  }
  function compare(a, b, sign) {
    if (a.number !== null && b.number !== null) return sign * (a.number - b.number);
    if (a.number !== null) return -1; // a number before a word or "-", either way
    if (b.number !== null) return 1;
    return sign * a.text.localeCompare(b.text);
  }
  function sortBy(table, column, heading) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var descending = heading.getAttribute("data-sorted") === "ascending";
    rows.sort(function (x, y) {
      return compare(key(x.cells[column]), key(y.cells[column]), descending ? -1 : 1);
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (cell) {
      cell.removeAttribute("data-sorted");
    });
    heading.setAttribute("data-sorted", descending ? "descending" : "ascending");
    rows.forEach(function (row) { body.appendChild(row); });
  }
  function enable() {
    document.querySelectorAll("article table").forEach(function (table) {
      if (!table.tHead || !table.tBodies.length) return;
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (heading, column) {
        heading.style.cursor = "pointer";
        heading.title = "sort by this column";
        heading.addEventListener("click", function () { sortBy(table, column, heading); });
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", enable);
  else enable();
})();
