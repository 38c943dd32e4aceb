// Users: the forms post to the server; the ones that take something away ask first.
"use strict";
(function () {
  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form.confirm");
    if (form && !confirm(form.dataset.confirm)) event.preventDefault();
  });
})();
