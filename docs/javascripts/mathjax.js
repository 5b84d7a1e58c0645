// MathJax 3 for pymdownx.arithmatex in generic mode (the mkdocs-material recipe):
// arithmatex wraps every formula in a span/div of class "arithmatex" with \( \) or \[ \]
// delimiters, and only those elements are typeset.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

// Typeset again after each page change of mkdocs-material's instant navigation.
document$.subscribe(() => {
  MathJax.startup.output.clearCache()
  MathJax.typesetClear()
  MathJax.texReset()
  MathJax.typesetPromise()
})
