"""The cuTile recipes: one module per recipe, named after its id, with its page `<module>.md`
beside it; and the cuTile-only parts that recipes are built from (the modules without a page).
playbook.base imports the recipe modules, which register their recipes on import."""
