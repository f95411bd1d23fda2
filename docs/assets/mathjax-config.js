// MathJax typesets only what pymdownx.arithmatex marked (class "arithmatex":
// \( \) inline, \[ \] display), so that text elsewhere (code, doctests with
// dollar signs) is left alone.  The bundle, tex-svg.js, is served by the site
// itself (docs/hooks/mathjax.py).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};
