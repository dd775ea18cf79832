document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (header, column) {
    header.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var ascending = !header.classList.contains("ascending");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("ascending", "descending"); });
      header.classList.add(ascending ? "ascending" : "descending");
      function key(row) {
        var text = row.cells[column].textContent.trim();
        if (text === "∞") return Infinity;
        var number = parseFloat(text.replace("−", "-"));
        return isNaN(number) ? text : number;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), order;
        if (typeof x === "number" && typeof y === "number") order = x - y;
        else if (typeof x === "number") order = -1;
        else if (typeof y === "number") order = 1;
        else order = x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
