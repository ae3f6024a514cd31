// MathJax 2.7 (served from the site: docs/hooks/mathjax.py) for the maths of the
// pages and docstrings (pymdownx.arithmatex, generic mode: \( \) and \[ \] inside
// span/div.arithmatex) and of the notebooks (rendered by mkdocs-jupyter with their
// $ $ and $$ $$ delimiters left in the text). Code blocks (pre, code) and the
// notebooks' copies of their code cells (clipboard-copy-txt) are never typeset.
// Read by MathJax.js when it loads (the script after this one).
// The configuration file that the package ships with MathJax 2.7 (TeX input,
// HTML-CSS output and the STIX-Web web fonts, all served from the site).
window.MathJax = {
  config: ["TeX-AMS-MML_HTMLorMML-full.js"],
  TeX: { extensions: ["AMSmath.js", "AMSsymbols.js", "noErrors.js", "noUndefined.js"] },
  tex2jax: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
    // A notebook's code cell keeps its source in a hidden div for its copy button:
    // typeset, its $ ... $ strings became maths and the button copied garbled code.
    ignoreClass: "tex2jax_ignore|clipboard-copy-txt",
  },
  "HTML-CSS": { availableFonts: [], preferredFont: null, webFont: "STIX-Web",
                imageFont: null },
  showMathMenu: false,
  messageStyle: "none",
};

// With Material's instant navigation a page is replaced without reloading scripts.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.Hub && MathJax.Hub.Queue) {
      MathJax.Hub.Queue(["Typeset", MathJax.Hub]);
    }
  });
}
