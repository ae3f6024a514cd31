// MathJax 3 for the maths of the pages and docstrings (pymdownx.arithmatex, generic
// mode: \( \) and \[ \] inside span/div.arithmatex) and of the notebooks (rendered by
// mkdocs-jupyter with their $ $ and $$ $$ delimiters left in the text). Code blocks
// (pre, code) are never typeset.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
};

// With Material's instant navigation a page is replaced without reloading scripts.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache();
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
